//! The agent as the [`Node`] the services beside it (API, proxy, certificates, dashboard)
//! use: [`handle`] (called by the composition root) hands out the [`NodeHandle`]
//! they hold, made by `handle`; agent errors become [`NodeError`]s with the same status.

use crate::agent::Agent;
use crate::error::AgentError;
use bazaar_catalog::{Catalog, SecretRecord};
use bazaar_node::secrets::SecretError;
use bazaar_node::{
    AuditEntry, Caller, HostLink, Node, NodeConfig, NodeError, NodeFuture, NodeHandle,
};
use bazaar_types::config::MachineConfig;
use bazaar_types::host::Resources;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The agent behind the [`Node`] interface, with the settings the services read.
#[derive(Debug)]
struct AgentNode {
    agent: Agent,
    config: NodeConfig,
}

/// `agent` as a node, for the services beside it; their tasks are tracked by the
/// handle's tracker (one per call: the composition root calls this once).
pub fn handle(agent: &Agent) -> NodeHandle {
    let c = agent.config();
    let config = NodeConfig {
        region: c.region.clone(),
        data_dir: c.data_dir.clone(),
        replace_after: c.replace_after,
        proxy_listen: c.proxy_listen,
        proxy_tls_listen: c.proxy_tls_listen,
        proxy_hop_listen: c.proxy_hop_listen,
        proxy_domain: c.proxy_domain.clone(),
        proxy_queue_timeout: c.proxy_queue_timeout,
        bid_deadline: c.bid_deadline,
        autostop_idle: c.autostop_idle,
        acme_directory: c.acme_directory.clone(),
        acme_ca: c.acme_ca.clone(),
    };
    NodeHandle::new(Arc::new(AgentNode {
        agent: agent.clone(),
        config,
    }))
}

impl From<AgentError> for NodeError {
    fn from(e: AgentError) -> NodeError {
        let (status, code) = e.status();
        NodeError {
            status,
            code,
            message: e.to_string(),
        }
    }
}

impl Node for AgentNode {
    fn host_id(&self) -> &str {
        self.agent.host_id()
    }

    fn config(&self) -> &NodeConfig {
        &self.config
    }

    fn catalog(&self) -> Option<&Catalog> {
        self.agent.catalog()
    }

    fn cluster_secret(&self) -> &str {
        self.agent.cluster_secret()
    }

    fn host_link(&self) -> Option<&HostLink> {
        self.agent.host_link()
    }

    fn shutdown_token(&self) -> CancellationToken {
        self.agent.shutdown_token()
    }

    fn caller(&self, token: &str) -> Result<Caller, bazaar_auth::Denied> {
        self.agent.caller(token)
    }

    fn record_audit(&self, entry: &AuditEntry) {
        self.agent.audit().append(entry);
    }

    fn validate_config(&self, config: &MachineConfig) -> Result<Resources, NodeError> {
        Ok(crate::operations::validate_config(config)?)
    }

    fn app_secrets(&self, app: &str) -> Vec<SecretRecord> {
        crate::app_secrets::app_secrets(&self.agent, app)
    }

    fn set_app_secrets(
        &self,
        app: &str,
        changes: &[(String, Option<String>)],
    ) -> Result<Vec<SecretRecord>, SecretError> {
        crate::app_secrets::set_app_secrets(&self.agent, app, changes)
    }

    fn secrets_version_header(&self, app: &str) -> Option<String> {
        crate::app_secrets::secrets_version_header(&self.agent, app)
    }

    fn start_machine<'a>(&'a self, id: &'a str) -> NodeFuture<'a, Result<(), NodeError>> {
        Box::pin(async move {
            crate::operations::start_machine(&self.agent, id, None).await?;
            Ok(())
        })
    }

    fn suspend_machine<'a>(&'a self, id: &'a str) -> NodeFuture<'a, Result<(), NodeError>> {
        Box::pin(async move {
            crate::operations::suspend_machine(&self.agent, id, None).await?;
            Ok(())
        })
    }

    fn stop_machine<'a>(&'a self, id: &'a str) -> NodeFuture<'a, Result<(), NodeError>> {
        Box::pin(async move {
            crate::operations::stop_machine(&self.agent, id, Default::default(), None).await?;
            Ok(())
        })
    }

    fn hold_for_move<'a>(&'a self, id: &'a str) -> NodeFuture<'a, Result<bool, NodeError>> {
        Box::pin(async move { Ok(crate::preempt::hold_for_move(&self.agent, id).await?) })
    }

    fn end_move(&self, id: &str, moved: bool) {
        crate::preempt::end_move(&self.agent, id, moved);
    }

    fn has_machine<'a>(&'a self, id: &'a str) -> NodeFuture<'a, Result<(), NodeError>> {
        Box::pin(async move {
            self.agent.machine(id).await?;
            Ok(())
        })
    }

    fn set_proxy_addrs(&self, proxy: SocketAddr, hop: Option<SocketAddr>) -> NodeFuture<'_, ()> {
        Box::pin(async move {
            if let Some(hop) = hop {
                crate::publish::set_proxy_hop_addr(&self.agent, hop).await;
            }
            crate::publish::set_proxy_addr(&self.agent, proxy).await
        })
    }

    fn metrics_text(&self) -> String {
        self.agent.metrics_text()
    }
}
