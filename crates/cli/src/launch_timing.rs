//! `bazaar machine explain --timing`: where a machine's last start went, step by step —
//! the placement (the exchange and the claim, from the placement record) and each launch
//! step the host recorded in the start event (`bazaar_runtime::timing` names them).

use bazaar_types::event::{MachineEvent, StepTiming};
use serde::Serialize;

/// What `--timing` shows (and prints with `--json`).
#[derive(Debug, Serialize)]
pub(crate) struct LaunchTiming {
    /// The placement's whole time, when its record is known here.
    pub placement_ms: Option<f64>,
    /// The start event's id.
    pub event: String,
    pub steps: Vec<StepTiming>,
    /// The launch's steps added up.
    pub launch_ms: f64,
}

/// The timing of the newest start in `events` that recorded one.
pub(crate) fn of(events: &[MachineEvent], placement_us: Option<u64>) -> Option<LaunchTiming> {
    let start = events
        .iter()
        .filter(|e| e.kind == "start")
        .filter(|e| e.request.as_ref().is_some_and(|r| !r.timing.is_empty()))
        .max_by(|a, b| a.id.cmp(&b.id))?;
    let steps = start.request.as_ref()?.timing.clone();
    Some(LaunchTiming {
        placement_ms: placement_us.map(|us| us as f64 / 1e3),
        event: start.id.clone(),
        launch_ms: steps.iter().map(|s| s.ms).sum(),
        steps,
    })
}

/// The table `--timing` prints.
pub(crate) fn render(t: &LaunchTiming) -> String {
    let mut table = comfy_table::Table::new();
    table.set_header(["step", "ms", "share"]);
    let whole = t.launch_ms + t.placement_ms.unwrap_or(0.0);
    let share = |ms: f64| {
        if whole > 0.0 {
            format!("{:.0} %", ms * 100.0 / whole)
        } else {
            "-".into()
        }
    };
    if let Some(ms) = t.placement_ms {
        table.add_row(["placement".into(), format!("{ms:.2}"), share(ms)]);
    }
    for s in &t.steps {
        table.add_row([s.step.clone(), format!("{:.2}", s.ms), share(s.ms)]);
    }
    table.add_row(["total".into(), format!("{whole:.2}"), share(whole)]);
    format!("start {}\n{table}", t.event)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(timing: &[(&str, f64)]) -> MachineEvent {
        MachineEvent::new("start", "started", "user").with_timing(
            timing
                .iter()
                .map(|(step, ms)| StepTiming {
                    step: (*step).into(),
                    ms: *ms,
                })
                .collect(),
        )
    }

    #[test]
    fn the_newest_timed_start_is_shown_with_its_placement() {
        let old = start(&[("network", 9.0)]);
        let new = start(&[("queued", 1.0), ("network", 0.5), ("ready", 2.5)]);
        let untimed = MachineEvent::new("start", "started", "user");
        let exit = MachineEvent::new("exit", "stopped", "user");
        let t = of(&[new.clone(), untimed, exit, old], Some(1_000)).unwrap();
        assert_eq!(t.event, new.id);
        assert_eq!(t.launch_ms, 4.0);
        let text = render(&t);
        for row in ["placement", "queued", "network", "ready", "total"] {
            assert!(text.contains(row), "{row} in {text}");
        }
        assert!(text.contains("5.00"), "placement + launch: {text}");
        assert!(of(&[MachineEvent::new("exit", "stopped", "user")], None).is_none());
    }
}
