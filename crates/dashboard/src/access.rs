//! Who may see and who may act: the one place the dashboard decides. Today every token the
//! Machines API accepts may act (tokens have no scopes yet); when scoped tokens arrive, a
//! read-only scope is checked in [`may_act`] alone and every page follows. Independently,
//! the script hides the actions as soon as the API answers one of them with 403.

use bazaar_agent::Agent;

/// True if `token` may sign in to the dashboard (the same check as the Machines API).
pub fn may_view(agent: &Agent, token: &str) -> bool {
    agent.authorized(token)
}

/// True if `token` may use the actions (start, stop, restart, cordon, destroy).
pub fn may_act(agent: &Agent, token: &str) -> bool {
    agent.authorized(token)
}
