//! The `tessera.v1.Scheduler` gRPC service: each call checks its message into domain
//! types (`invalid_argument` naming the field otherwise), then asks the [`Swarm`].

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tessera_proto::domain::{self, Announce, FindPeers, Host, HostId};
use tessera_proto::pb;
use tonic::{Request, Response, Status};

use crate::preheat::Preheats;
use crate::swarm::{Decision, Swarm, UnknownHost};

/// The service, sharing one [`Swarm`] between connections.
#[derive(Debug, Clone)]
pub struct SchedulerService {
    swarm: Arc<Mutex<Swarm>>,
    preheats: Arc<Mutex<Preheats>>,
}

impl SchedulerService {
    /// The service over `swarm`, handing out `preheats` in heartbeat answers.
    pub fn new(swarm: Arc<Mutex<Swarm>>, preheats: Arc<Mutex<Preheats>>) -> Self {
        SchedulerService { swarm, preheats }
    }

    fn swarm(&self) -> std::sync::MutexGuard<'_, Swarm> {
        self.swarm.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl From<UnknownHost> for Status {
    fn from(e: UnknownHost) -> Self {
        Status::failed_precondition(e.to_string())
    }
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[tonic::async_trait]
impl pb::scheduler_server::Scheduler for SchedulerService {
    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterResponse>, Status> {
        let host = request
            .into_inner()
            .host
            .ok_or_else(|| Status::invalid_argument("invalid host: missing"))?;
        let host = Host::try_from(host).map_err(|e| Status::from(prefix(e, "host")))?;
        tracing::info!(host = %host.id.0, address = %host.address, "registered");
        let lease = self.swarm().register(host, Instant::now());
        Ok(Response::new(pb::RegisterResponse {
            lease_ms: millis(lease),
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let r = request.into_inner();
        let id = HostId::parse("host_id", r.host_id)?;
        let answer = match self
            .swarm()
            .heartbeat(&id, r.active_uploads, Instant::now())
        {
            Ok(lease) => pb::HeartbeatResponse {
                lease_ms: millis(lease),
                reregister: false,
                preheats: self
                    .preheats
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .heartbeat(&id.0, &r.preheats),
            },
            Err(_) => pb::HeartbeatResponse {
                lease_ms: 0,
                reregister: true,
                preheats: Vec::new(),
            },
        };
        Ok(Response::new(answer))
    }

    async fn announce(
        &self,
        request: Request<pb::AnnounceRequest>,
    ) -> Result<Response<pb::AnnounceResponse>, Status> {
        let a = Announce::try_from(request.into_inner())?;
        self.swarm().announce(a, Instant::now())?;
        Ok(Response::new(pb::AnnounceResponse {}))
    }

    async fn find_peers(
        &self,
        request: Request<pb::FindPeersRequest>,
    ) -> Result<Response<pb::FindPeersResponse>, Status> {
        let f = FindPeers::try_from(request.into_inner())?;
        let decision = self.swarm().find_peers(&f, Instant::now())?;
        let answer = match decision {
            Decision::Peers(peers) => pb::FindPeersResponse {
                action: pb::Action::Peers.into(),
                peers: peers
                    .into_iter()
                    .map(|(id, addr, whole_blob)| pb::Peer {
                        host_id: id.0,
                        address: addr.to_string(),
                        whole_blob,
                    })
                    .collect(),
                wait_ms: 0,
            },
            Decision::Origin => pb::FindPeersResponse {
                action: pb::Action::Origin.into(),
                peers: Vec::new(),
                wait_ms: 0,
            },
            Decision::Wait(d) => pb::FindPeersResponse {
                action: pb::Action::Wait.into(),
                peers: Vec::new(),
                wait_ms: millis(d),
            },
        };
        Ok(Response::new(answer))
    }

    async fn report(
        &self,
        request: Request<pb::ReportRequest>,
    ) -> Result<Response<pb::ReportResponse>, Status> {
        let r = request.into_inner();
        let host = HostId::parse("host_id", r.host_id)?;
        let transfers = r
            .transfers
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                domain::Transfer::try_from(t).map_err(|e| prefix(e, &format!("transfers[{i}]")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.swarm().report(&host, &transfers, Instant::now())?;
        Ok(Response::new(pb::ReportResponse {}))
    }

    async fn leave(
        &self,
        request: Request<pb::LeaveRequest>,
    ) -> Result<Response<pb::LeaveResponse>, Status> {
        let id = HostId::parse("host_id", request.into_inner().host_id)?;
        tracing::info!(host = %id.0, "left");
        self.swarm().leave(&id);
        Ok(Response::new(pb::LeaveResponse {}))
    }
}

/// Names a nested field from its parent (`host` + `address` → `host.address`).
fn prefix(e: domain::Invalid, parent: &str) -> domain::Invalid {
    domain::Invalid {
        field: format!("{parent}.{}", e.field),
        reason: e.reason,
    }
}
