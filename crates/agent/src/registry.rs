//! The actor registry: the channel to each machine's actor ([`crate::actor`]), by machine
//! id. The accept side hands accepted operations to an actor through it; an actor
//! registers when it starts and leaves when its machine is destroyed or the agent stops.
//! Each channel is bounded ([`QUEUE`]): the accept side takes a place in it before it
//! records an operation, and a machine whose actor has that many operations waiting
//! refuses more (503, [`AgentError::Busy`]) rather than let them pile up.

use crate::error::AgentError;
use crate::record::Operation;
use crate::sync::lock;
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::mpsc;

/// Messages to a machine's actor.
#[derive(Debug)]
pub enum ActorMsg {
    /// A newly accepted operation.
    Op(Operation),
}

/// Operations that may wait in the channel to one machine's actor (it takes all that
/// wait between two steps): past this, the machine refuses more until it catches up.
pub const QUEUE: usize = 64;

/// The channel to every running actor.
#[derive(Debug, Default)]
pub(crate) struct Actors(Mutex<HashMap<String, mpsc::Sender<ActorMsg>>>);

impl Actors {
    /// Registers the actor of machine `id` (replacing an earlier one) and returns what it
    /// receives.
    pub(crate) fn register(&self, id: &str) -> mpsc::Receiver<ActorMsg> {
        let (tx, rx) = mpsc::channel(QUEUE);
        lock(&self.0).insert(id.to_string(), tx);
        rx
    }

    /// A place in the channel to machine `id`'s actor, taken before an operation is
    /// recorded (so a refusal records nothing). Refused when no actor runs (the agent is
    /// shutting down) or [`QUEUE`] operations already wait.
    pub(crate) fn reserve(&self, id: &str) -> Result<mpsc::OwnedPermit<ActorMsg>, AgentError> {
        let tx = lock(&self.0).get(id).cloned();
        let tx = tx.ok_or(AgentError::ShuttingDown)?;
        tx.try_reserve_owned().map_err(|err| match err {
            mpsc::error::TrySendError::Full(_) => AgentError::Busy(format!(
                "machine {id} is busy: {QUEUE} operations are waiting for it; retry later"
            )),
            mpsc::error::TrySendError::Closed(_) => AgentError::ShuttingDown,
        })
    }

    /// How many actors run (one per machine that is not destroyed).
    pub(crate) fn len(&self) -> usize {
        lock(&self.0).len()
    }

    /// Removes machine `id`'s actor (its machine is destroyed).
    pub(crate) fn remove(&self, id: &str) {
        lock(&self.0).remove(id);
    }

    /// An actor that ends removes itself if the agent is `shutting_down` or no newer actor
    /// of the same machine replaced it (its own channel is closed once it is gone).
    pub(crate) fn retire(&self, id: &str, shutting_down: bool) {
        let mut actors = lock(&self.0);
        if shutting_down || actors.get(id).is_some_and(|tx| tx.is_closed()) {
            actors.remove(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_channel_refuses_with_busy_and_a_missing_actor_with_shutting_down() {
        let actors = Actors::default();
        assert!(matches!(actors.reserve("m"), Err(AgentError::ShuttingDown)));
        let rx = actors.register("m");
        let places: Vec<_> = (0..QUEUE).map(|_| actors.reserve("m").unwrap()).collect();
        let busy = actors.reserve("m").unwrap_err();
        assert!(matches!(busy, AgentError::Busy(_)), "{busy}");
        assert_eq!(busy.status().0, axum::http::StatusCode::SERVICE_UNAVAILABLE);
        // A place given back (an operation not recorded after all) is free again.
        drop(places);
        assert!(actors.reserve("m").is_ok());
        // An actor that ended leaves the registry.
        drop(rx);
        assert!(matches!(actors.reserve("m"), Err(AgentError::ShuttingDown)));
        actors.retire("m", false);
        assert_eq!(actors.len(), 0);
    }
}
