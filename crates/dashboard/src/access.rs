//! Who may see and who may act: the one place the dashboard decides, from the caller the
//! Machines API would see ([`Node::caller`]). The dashboard shows the whole fleet (every
//! host, app and machine), so it takes tokens that are not limited to some apps; a
//! read-only token sees everything and gets no actions. Independently, the script hides
//! the actions as soon as the API answers one of them with 403.

use bazaar_auth::{Access, Op};
use bazaar_node::Node;

/// An app name that no app can have: a token limited to some apps is refused it.
const ANY_APP: &str = "*";

/// True if `token` may sign in to the dashboard: a valid token that may read every app.
pub fn may_view(node: &dyn Node, token: &str) -> bool {
    may(node, token, Op::Read)
}

/// True if `token` may use the actions (start, stop, restart, cordon, destroy): every one
/// of them, on every app (a read-only token may not).
pub fn may_act(node: &dyn Node, token: &str) -> bool {
    [Op::Start, Op::Stop, Op::Restart, Op::Update, Op::Destroy]
        .into_iter()
        .all(|op| may(node, token, op))
}

fn may(node: &dyn Node, token: &str, op: Op) -> bool {
    node.caller(token).is_ok_and(|caller| {
        caller
            .authorize(&Access {
                app: Some(ANY_APP),
                op,
                process: false,
                runtime: None,
            })
            .is_ok()
    })
}
