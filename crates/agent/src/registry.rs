//! The actor registry: the channel to each machine's actor ([`crate::actor`]), by machine
//! id. The accept side hands accepted operations to an actor through it; an actor
//! registers when it starts and leaves when its machine is destroyed or the agent stops.

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

/// The channel to every running actor.
#[derive(Debug, Default)]
pub(crate) struct Actors(Mutex<HashMap<String, mpsc::UnboundedSender<ActorMsg>>>);

impl Actors {
    /// Registers the actor of machine `id` (replacing an earlier one) and returns what it
    /// receives.
    pub(crate) fn register(&self, id: &str) -> mpsc::UnboundedReceiver<ActorMsg> {
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.0).insert(id.to_string(), tx);
        rx
    }

    /// The channel to machine `id`'s actor, if it runs.
    pub(crate) fn sender(&self, id: &str) -> Option<mpsc::UnboundedSender<ActorMsg>> {
        lock(&self.0).get(id).cloned()
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
