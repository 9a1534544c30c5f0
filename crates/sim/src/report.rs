//! The comparison table, CSV files and SVG plots (hand-written SVG: line charts of the host
//! load distribution, the latency CDF and imbalance over time). Everything here is a pure
//! function of the summaries, so the same run writes the same bytes.

use crate::config::Scenario;
use crate::metrics::{quantile, Summary};
use std::fmt::Write as _;
use std::path::Path;

/// The comparison table, one row per policy.
pub fn table(scenario: &Scenario, runs: &[Summary]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "scenario {}: {} hosts, {} regions, {} machines, {} exchanges, gossip {} ms, rtt {} ms, seed {}",
        scenario.name,
        scenario.hosts,
        scenario.regions,
        scenario.placements,
        scenario.exchanges,
        scenario.gossip_delay_ms,
        scenario.rtt_ms,
        scenario.seed
    );
    let header = [
        "policy",
        "placed",
        "ICE",
        "false ICE",
        "msgs/mach",
        "lat p50 ms",
        "lat p99 ms",
        "load mean",
        "max/mean",
        "CV",
        "p99 load",
        "hot %",
        "fill 90% s",
    ];
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                r.policy.clone(),
                r.placed.to_string(),
                r.failed.to_string(),
                r.false_ice.to_string(),
                format!("{:.2}", r.messages_per_machine()),
                format!("{:.2}", r.latency_ms(0.5)),
                format!("{:.2}", r.latency_ms(0.99)),
                format!("{:.3}", r.final_stats.mean),
                format!("{:.3}", r.final_stats.max_over_mean),
                format!("{:.3}", r.final_stats.cv),
                format!("{:.3}", r.final_stats.p99),
                format!("{:.1}", r.final_stats.hot * 100.0),
                r.fill90
                    .map(|(t, _)| format!("{t:.1}"))
                    .unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].chars().count())
                .chain([header[c].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<String>, out: &mut String| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(c, s)| {
                if c == 0 {
                    format!("{s:<w$}", w = widths[c])
                } else {
                    format!("{s:>w$}", w = widths[c])
                }
            })
            .collect();
        let _ = writeln!(out, "{}", parts.join("  ").trim_end());
    };
    line(header.iter().map(|s| s.to_string()).collect(), &mut out);
    for r in rows {
        line(r, &mut out);
    }
    out
}

/// The table as Markdown (for docs/SIMULATION.md).
pub fn markdown(runs: &[Summary]) -> String {
    let mut out = String::from(
        "| policy | placed | ICE | false ICE | msgs/machine | latency p50 / p99 ms | max/mean | CV | p99 load | hot % |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in runs {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.2} | {:.2} / {:.2} | {:.3} | {:.3} | {:.3} | {:.1} |",
            r.policy,
            r.placed,
            r.failed,
            r.false_ice,
            r.messages_per_machine(),
            r.latency_ms(0.5),
            r.latency_ms(0.99),
            r.final_stats.max_over_mean,
            r.final_stats.cv,
            r.final_stats.p99,
            r.final_stats.hot * 100.0
        );
    }
    out
}

/// Writes summary.csv, loads.csv, latency_cdf.csv, imbalance.csv and the three SVG plots
/// into `dir`, names prefixed with the scenario's name.
pub fn write_files(dir: &Path, scenario: &Scenario, runs: &[Summary]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let name = &scenario.name;
    let write = |file: String, text: String| std::fs::write(dir.join(file), text);
    write(format!("{name}-summary.csv"), summary_csv(runs))?;
    let (loads, lat, imb) = (
        load_curves(runs),
        latency_curves(runs),
        imbalance_curves(runs),
    );
    write(
        format!("{name}-loads.csv"),
        curves_csv("policy,host_fraction,load", &loads),
    )?;
    write(
        format!("{name}-latency_cdf.csv"),
        curves_csv("policy,latency_ms,fraction", &lat),
    )?;
    write(
        format!("{name}-imbalance.csv"),
        curves_csv("policy,t_s,cv", &imb),
    )?;
    write(
        format!("{name}-loads.svg"),
        line_chart(
            &format!("{name}: host load, sorted (end of run)"),
            "fraction of hosts",
            "load (max of memory, cpu)",
            &loads,
            false,
        ),
    )?;
    write(
        format!("{name}-latency.svg"),
        line_chart(
            &format!("{name}: placement latency CDF"),
            "latency (ms, log scale)",
            "fraction of placements",
            &lat,
            true,
        ),
    )?;
    write(
        format!("{name}-imbalance.svg"),
        line_chart(
            &format!("{name}: imbalance over time"),
            "virtual time (s)",
            "coefficient of variation of host load",
            &imb,
            false,
        ),
    )?;
    Ok(())
}

/// One row per policy with every measure.
pub fn summary_csv(runs: &[Summary]) -> String {
    let mut out = String::from(
        "policy,requests,machines,placed,failed,false_ice,messages,messages_per_machine,refusals,no_answers,claim_failures,expired_reservations,lost,latency_p50_ms,latency_p90_ms,latency_p99_ms,latency_mean_ms,load_mean,max_over_mean,cv,p10,p50,p90,p99,max,hot_fraction,steady_cv,steady_max_over_mean,fill90_s,fill90_placed,virtual_s,events,invariant_violations\n",
    );
    for r in runs {
        let s = &r.final_stats;
        let (f_s, f_n) = r
            .fill90
            .map(|(t, n)| (format!("{t:.3}"), n.to_string()))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{:.4},{},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{},{},{:.3},{},{}",
            r.policy,
            r.requests,
            r.machines,
            r.placed,
            r.failed,
            r.false_ice,
            r.messages,
            r.messages_per_machine(),
            r.refusals,
            r.no_answers,
            r.claim_failures,
            r.expired_reservations,
            r.lost,
            r.latency_ms(0.5),
            r.latency_ms(0.9),
            r.latency_ms(0.99),
            r.mean_latency_ms(),
            s.mean,
            s.max_over_mean,
            s.cv,
            s.p10,
            s.p50,
            s.p90,
            s.p99,
            s.max,
            s.hot,
            r.steady_cv,
            r.steady_max_over_mean,
            f_s,
            f_n,
            r.virtual_s,
            r.events,
            r.invariant_violations
        );
    }
    out
}

type Curve = (String, Vec<(f64, f64)>);

const POINTS: usize = 200;

fn load_curves(runs: &[Summary]) -> Vec<Curve> {
    runs.iter()
        .map(|r| {
            let pts = (0..=POINTS)
                .map(|i| {
                    let q = i as f64 / POINTS as f64;
                    (q, quantile(&r.final_loads, q.max(1e-9)))
                })
                .collect();
            (r.policy.clone(), pts)
        })
        .collect()
}

fn latency_curves(runs: &[Summary]) -> Vec<Curve> {
    runs.iter()
        .map(|r| {
            let pts = (1..=POINTS)
                .map(|i| {
                    let q = i as f64 / POINTS as f64;
                    (quantile(&r.latencies_us, q) as f64 / 1000.0, q)
                })
                .collect();
            (r.policy.clone(), pts)
        })
        .collect()
}

fn imbalance_curves(runs: &[Summary]) -> Vec<Curve> {
    runs.iter()
        .map(|r| {
            let pts = r.series.iter().map(|s| (s.t_s, s.stats.cv)).collect();
            (r.policy.clone(), pts)
        })
        .collect()
}

fn curves_csv(header: &str, curves: &[Curve]) -> String {
    let mut out = format!("{header}\n");
    for (name, pts) in curves {
        for (x, y) in pts {
            let _ = writeln!(out, "{name},{x:.6},{y:.6}");
        }
    }
    out
}

const COLORS: [&str; 12] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#000000", "#aec7e8",
];

/// A line chart as SVG text: one line per series, axes with ticks, a legend.
pub fn line_chart(
    title: &str,
    xlabel: &str,
    ylabel: &str,
    series: &[Curve],
    log_x: bool,
) -> String {
    let (w, h) = (760.0, 460.0);
    let (left, right, top, bottom) = (70.0, 190.0, 40.0, 50.0);
    let pw = w - left - right;
    let ph = h - top - bottom;
    let tx = |x: f64| if log_x { x.max(1e-3).log10() } else { x };
    let all: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|&(x, y)| (tx(x), y)))
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect();
    let (mut x0, mut x1) = all
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &(x, _)| (a.min(x), b.max(x)));
    let (mut y0, mut y1) = all
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &(_, y)| (a.min(y), b.max(y)));
    if all.is_empty() {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    if log_x {
        x0 = x0.floor();
        x1 = x1.ceil();
    }
    y0 = y0.min(0.0);
    if x1 - x0 < 1e-12 {
        x1 = x0 + 1.0;
    }
    if y1 - y0 < 1e-12 {
        y1 = y0 + 1.0;
    }
    y1 += (y1 - y0) * 0.05;
    let px = |x: f64| left + (tx(x) - x0) / (x1 - x0) * pw;
    let py = |y: f64| top + ph - (y - y0) / (y1 - y0) * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        left + pw / 2.0,
        esc(title)
    );
    let _ = writeln!(
        s,
        r##"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>"##
    );
    for i in 0..=5 {
        let fy = y0 + (y1 - y0) * i as f64 / 5.0;
        let y = py(fy);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            left + pw,
            left - 6.0,
            y + 4.0,
            tick(fy)
        );
    }
    let xticks: Vec<f64> = if log_x {
        (x0 as i64..=x1 as i64)
            .map(|e| 10f64.powi(e as i32))
            .collect()
    } else {
        (0..=5).map(|i| x0 + (x1 - x0) * i as f64 / 5.0).collect()
    };
    for fx in xticks {
        let x = px(fx);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{:.1}" stroke="#eee"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            top + ph,
            top + ph + 16.0,
            tick(fx)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        left + pw / 2.0,
        h - 12.0,
        esc(xlabel)
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{:.1}" text-anchor="middle" transform="rotate(-90 16 {:.1})">{}</text>"#,
        top + ph / 2.0,
        top + ph / 2.0,
        esc(ylabel)
    );
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> = pts
            .iter()
            .filter(|(x, y)| tx(*x).is_finite() && y.is_finite())
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let dash = if i >= COLORS.len() {
            r#" stroke-dasharray="4 3""#
        } else {
            ""
        };
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.6"{dash} points="{}"/>"#,
            path.join(" ")
        );
        let ly = top + 14.0 + i as f64 * 18.0;
        let lx = left + pw + 12.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            lx + 22.0,
            lx + 28.0,
            ly + 4.0,
            esc(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn tick(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else if v.abs() >= 0.1 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_is_well_formed_svg() {
        let svg = line_chart(
            "t <1>",
            "x",
            "y",
            &[
                ("a".into(), vec![(1.0, 0.5), (10.0, 1.0)]),
                ("b".into(), vec![]),
            ],
            true,
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("t &lt;1&gt;"));
        assert_eq!(svg.matches("<polyline").count(), 2);
    }
}
