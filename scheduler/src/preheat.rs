//! Preheat jobs: an administrator names an image (and how many hosts, or which labels),
//! the scheduler picks the hosts and hands each the job in its next heartbeat answer,
//! and the agents fetch the whole image into their caches with their *own* registry
//! credentials (the scheduler never holds any). Agents report progress in their
//! heartbeats. A job ends when every chosen host has finished: `succeeded` if all did,
//! `failed` if any failed, left the swarm, or ran past the job's deadline.
//!
//! Jobs outlive a restart (they are kept in the [`Store`]); unfinished ones are handed
//! out again as hosts re-register, and agents that still run them ignore the repeat.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tessera_proto::pb;

use crate::store::Store;
use crate::Error;

/// How long a job may run before its unfinished hosts count as failed, unless the
/// request says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3600);

/// The longest deadline a request may ask for: a day. A job that has not finished by
/// then is stuck, and a deadline far in the future would keep it (and its hosts'
/// parts) unfinished for good.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// The most hosts a request may name in `count`: ten times the swarm the scheduler is
/// sized for (10,000 hosts). Every matching host, however many, is asked for by
/// leaving `count` out.
pub const MAX_COUNT: usize = 100_000;

/// The longest image reference accepted (before it is parsed).
pub const MAX_IMAGE_LEN: usize = 1024;

/// Finished jobs kept for queries; older ones are forgotten first.
const KEEP_FINISHED: usize = 1000;

/// Where a job, or one host's part of it, stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Not started yet (the host has not picked it up).
    Pending,
    Running,
    Succeeded,
    Failed,
}

impl State {
    pub const ALL: [State; 4] = [
        State::Pending,
        State::Running,
        State::Succeeded,
        State::Failed,
    ];

    /// As in the API (and the metrics' `state` label).
    pub fn name(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Running => "running",
            State::Succeeded => "succeeded",
            State::Failed => "failed",
        }
    }

    pub fn finished(self) -> bool {
        matches!(self, State::Succeeded | State::Failed)
    }
}

/// One host's part of a job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostPart {
    pub state: State,
    pub chunks_done: u64,
    pub chunks_total: u64,
    pub bytes_done: u64,
    pub bytes_total: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A preheat job as the admin API shows it (and the store keeps it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    pub id: String,
    pub image: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform: Option<String>,
    pub state: State,
    /// Seconds since the epoch.
    pub created: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished: Option<u64>,
    /// Seconds after `created` when unfinished hosts count as failed.
    pub timeout_secs: u64,
    /// The chosen hosts, by id.
    pub hosts: BTreeMap<String, HostPart>,
    /// Why the job failed, host by host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `POST /api/v1/preheat`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreheatRequest {
    /// An OCI image reference, at most [`MAX_IMAGE_LEN`] characters.
    pub image: String,
    /// How many hosts (1 to [`MAX_COUNT`]); all that match when absent.
    #[serde(default)]
    pub count: Option<usize>,
    /// Only hosts with all these labels (`zone`, `rack`, …).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// `os/arch[/variant]`; each host's own when absent.
    #[serde(default)]
    pub platform: Option<String>,
    /// Seconds until unfinished hosts fail (1 to [`MAX_TIMEOUT`]); [`DEFAULT_TIMEOUT`]
    /// when absent.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

/// Why a preheat request was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The request itself is wrong (400).
    Invalid(String),
    /// Not enough hosts to meet it (409).
    NotEnoughHosts(String),
}

/// All jobs, in memory and (when there is a store) on disk.
#[derive(Debug)]
pub struct Preheats {
    jobs: HashMap<String, Job>,
    store: Option<Store>,
    /// Jobs created since start (part of what makes ids unique).
    sequence: u64,
    /// Hosts with unfinished parts that were not registered at a tick, since when:
    /// after a scheduler restart, or a host's quick restart, they get a grace period
    /// to register again before their parts fail.
    missing_since: HashMap<String, Instant>,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Checks the image as agents will read it (the same parser: `oci-reference`), so a job
/// for something that can never be an image is refused before any host is bothered.
/// The characters are checked first, to say which one is wrong.
fn check_image(image: &str) -> Result<(), String> {
    if image.is_empty() || image.len() > MAX_IMAGE_LEN {
        return Err(format!(
            "image: must be a reference of 1 to {MAX_IMAGE_LEN} characters, not {}",
            image.len()
        ));
    }
    if let Some(c) = image
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || !c.is_ascii())
    {
        return Err(format!("image: {c:?} cannot appear in an image reference"));
    }
    oci_reference::Reference::parse(image)
        .map(drop)
        .map_err(|e| format!("image: {e}"))
}

fn check_platform(platform: &str) -> Result<(), String> {
    platform
        .parse::<oci_reference::Platform>()
        .map(drop)
        .map_err(|_| format!("platform: {platform:?} is not os/arch[/variant]"))
}

impl PreheatRequest {
    /// Checks every field against its bound (documented in
    /// `docs/scheduler-admin-api.yaml`); answers the deadline in seconds.
    fn check(&self) -> Result<u64, String> {
        check_image(&self.image)?;
        if let Some(p) = &self.platform {
            check_platform(p)?;
        }
        if let Some(count) = self.count {
            if !(1..=MAX_COUNT).contains(&count) {
                return Err(format!("count: must be 1 to {MAX_COUNT}, not {count}"));
            }
        }
        let max = MAX_TIMEOUT.as_secs();
        let timeout_secs = self.timeout_secs.unwrap_or(DEFAULT_TIMEOUT.as_secs());
        if !(1..=max).contains(&timeout_secs) {
            return Err(format!(
                "timeout_secs: must be 1 to {max} (24 h), not {timeout_secs}"
            ));
        }
        Ok(timeout_secs)
    }
}

impl Preheats {
    /// Loads the jobs kept in `store` (none without one).
    pub fn open(store: Option<Store>) -> Result<Preheats, Error> {
        let mut jobs = HashMap::new();
        if let Some(store) = &store {
            for bytes in store.preheat_jobs()? {
                let job: Job = serde_json::from_slice(&bytes).map_err(|e| Error::Store {
                    what: "read a preheat job".into(),
                    reason: e.to_string(),
                })?;
                jobs.insert(job.id.clone(), job);
            }
        }
        Ok(Preheats {
            jobs,
            store,
            sequence: 0,
            missing_since: HashMap::new(),
        })
    }

    /// Starts a job on hosts chosen from `candidates` (registered, not blocked: `(id,
    /// labels)`), spread at random.
    pub fn create(
        &mut self,
        request: PreheatRequest,
        candidates: Vec<(String, BTreeMap<String, String>)>,
    ) -> Result<Job, Refusal> {
        let timeout_secs = request.check().map_err(Refusal::Invalid)?;
        let mut matching: Vec<String> = candidates
            .into_iter()
            .filter(|(_, labels)| {
                request
                    .labels
                    .iter()
                    .all(|(k, v)| labels.get(k).is_some_and(|l| l == v))
            })
            .map(|(id, _)| id)
            .collect();
        let wanted = request.count.unwrap_or(matching.len());
        if matching.is_empty() || matching.len() < wanted {
            return Err(Refusal::NotEnoughHosts(format!(
                "{} registered, unblocked host(s) match{}; the job needs {}",
                matching.len(),
                if request.labels.is_empty() {
                    String::new()
                } else {
                    format!(" the labels {:?}", request.labels)
                },
                wanted.max(1)
            )));
        }
        // A random order (std's hasher is seeded at random), so repeated jobs do not
        // always land on the same hosts.
        let seed = std::collections::hash_map::RandomState::new();
        matching.sort_by_cached_key(|id| {
            let mut h = seed.build_hasher();
            h.write(id.as_bytes());
            h.finish()
        });
        matching.truncate(wanted);
        let created = now_secs();
        self.sequence += 1;
        // Random bits too, so ids stay unique across restarts within one second.
        let mut tag = seed.build_hasher();
        tag.write_u64(self.sequence);
        let job = Job {
            id: format!("ph-{created:x}-{:08x}", tag.finish() as u32),
            image: request.image,
            platform: request.platform,
            state: State::Pending,
            created,
            finished: None,
            timeout_secs,
            hosts: matching
                .into_iter()
                .map(|id| {
                    (
                        id,
                        HostPart {
                            state: State::Pending,
                            chunks_done: 0,
                            chunks_total: 0,
                            bytes_done: 0,
                            bytes_total: 0,
                            error: None,
                        },
                    )
                })
                .collect(),
            error: None,
        };
        tracing::info!(job = %job.id, image = %job.image, hosts = job.hosts.len(), "preheat job created");
        self.jobs.insert(job.id.clone(), job.clone());
        self.persist(&job.id);
        self.prune();
        Ok(job)
    }

    pub fn get(&self, id: &str) -> Option<&Job> {
        self.jobs.get(id)
    }

    /// Jobs in `state`.
    pub fn count(&self, state: State) -> usize {
        self.jobs.values().filter(|j| j.state == state).count()
    }

    /// Every job, newest first.
    pub fn list(&self) -> Vec<&Job> {
        let mut all: Vec<&Job> = self.jobs.values().collect();
        all.sort_by(|a, b| b.created.cmp(&a.created).then(b.id.cmp(&a.id)));
        all
    }

    /// Applies `host`'s heartbeat report and answers the jobs it should start: those
    /// it was given, not finished, and not in its report.
    pub fn heartbeat(
        &mut self,
        host: &str,
        reported: &[pb::PreheatProgress],
    ) -> Vec<pb::PreheatTask> {
        let mut changed = Vec::new();
        for p in reported {
            let Some(job) = self.jobs.get_mut(&p.job_id) else {
                continue;
            };
            let Some(part) = job.hosts.get_mut(host) else {
                continue;
            };
            if part.state.finished() || job.state.finished() {
                continue;
            }
            let state = match pb::PreheatState::try_from(p.state) {
                Ok(pb::PreheatState::Running) => State::Running,
                Ok(pb::PreheatState::Succeeded) => State::Succeeded,
                Ok(pb::PreheatState::Failed) => State::Failed,
                _ => continue,
            };
            part.chunks_done = p.chunks_done;
            part.chunks_total = p.chunks_total;
            part.bytes_done = p.bytes_done;
            part.bytes_total = p.bytes_total;
            if state == State::Failed {
                let reason: String = p.error.chars().take(1024).collect();
                part.error = Some(if reason.is_empty() {
                    "the agent gave no reason".into()
                } else {
                    reason
                });
            }
            if part.state != state {
                part.state = state;
                changed.push(job.id.clone());
            }
        }
        for id in changed {
            self.settle(&id);
        }
        self.jobs
            .values()
            .filter(|job| !job.state.finished())
            .filter(|job| job.hosts.get(host).is_some_and(|p| !p.state.finished()))
            .filter(|job| !reported.iter().any(|p| p.job_id == job.id))
            .map(|job| pb::PreheatTask {
                job_id: job.id.clone(),
                image: job.image.clone(),
                platform: job.platform.clone().unwrap_or_default(),
            })
            .collect()
    }

    /// Fails the parts of hosts that have not been registered (`registered` says who
    /// is) for longer than `grace`, and of jobs past their deadline. Called once a
    /// second.
    pub fn tick(&mut self, registered: impl Fn(&str) -> bool, grace: Duration, now: Instant) {
        let wall = now_secs();
        let mut changed = Vec::new();
        let mut missing = HashMap::new();
        for job in self.jobs.values_mut().filter(|j| !j.state.finished()) {
            let late = wall >= job.created.saturating_add(job.timeout_secs);
            for (host, part) in job.hosts.iter_mut().filter(|(_, p)| !p.state.finished()) {
                let gone = !registered(host) && {
                    let since = *self.missing_since.get(host).unwrap_or(&now);
                    missing.insert(host.clone(), since);
                    now.duration_since(since) >= grace
                };
                let why = if late {
                    format!("not finished within timeout_secs ({})", job.timeout_secs)
                } else if gone {
                    "the host left the swarm before finishing".to_string()
                } else {
                    continue;
                };
                part.state = State::Failed;
                part.error = Some(why);
                changed.push(job.id.clone());
            }
        }
        self.missing_since = missing;
        changed.dedup();
        for id in changed {
            self.settle(&id);
        }
    }

    /// Derives the job's state from its hosts' and keeps it.
    fn settle(&mut self, id: &str) {
        let Some(job) = self.jobs.get_mut(id) else {
            return;
        };
        let parts = job.hosts.values();
        let all_done = parts.clone().all(|p| p.state.finished());
        let state = if all_done {
            if parts.clone().all(|p| p.state == State::Succeeded) {
                State::Succeeded
            } else {
                State::Failed
            }
        } else if parts.clone().all(|p| p.state == State::Pending) {
            State::Pending
        } else {
            State::Running
        };
        if state.finished() && !job.state.finished() {
            job.finished = Some(now_secs());
            let failures: Vec<String> = job
                .hosts
                .iter()
                .filter_map(|(h, p)| p.error.as_ref().map(|e| format!("{h}: {e}")))
                .collect();
            if state == State::Failed {
                job.error = Some(format!(
                    "{} of {} host(s) failed: {}",
                    failures.len(),
                    job.hosts.len(),
                    failures.join("; ")
                ));
            }
            tracing::info!(job = %job.id, state = ?state, "preheat job finished");
        }
        job.state = state;
        self.persist(id);
    }

    fn persist(&self, id: &str) {
        let (Some(store), Some(job)) = (&self.store, self.jobs.get(id)) else {
            return;
        };
        let result = serde_json::to_vec(job)
            .map_err(|e| Error::Store {
                what: "encode a preheat job".into(),
                reason: e.to_string(),
            })
            .and_then(|bytes| store.put_preheat_job(id, &bytes));
        if let Err(e) = result {
            tracing::error!(job = id, error = %e, "could not keep a preheat job; it will not survive a restart");
        }
    }

    /// Forgets the oldest finished jobs beyond [`KEEP_FINISHED`].
    fn prune(&mut self) {
        let mut finished: Vec<(u64, String)> = self
            .jobs
            .values()
            .filter(|j| j.state.finished())
            .map(|j| (j.finished.unwrap_or(j.created), j.id.clone()))
            .collect();
        if finished.len() <= KEEP_FINISHED {
            return;
        }
        finished.sort_unstable();
        let excess = finished.len() - KEEP_FINISHED;
        for (_, id) in finished.into_iter().take(excess) {
            self.jobs.remove(&id);
            if let Some(store) = &self.store {
                if let Err(e) = store.remove_preheat_job(&id) {
                    tracing::warn!(job = %id, error = %e, "could not forget a preheat job");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(n: usize) -> Vec<(String, BTreeMap<String, String>)> {
        (0..n)
            .map(|i| {
                let zone = if i % 2 == 0 { "a" } else { "b" };
                (
                    format!("h{i}"),
                    [("zone".to_string(), zone.to_string())].into(),
                )
            })
            .collect()
    }

    fn request(image: &str, count: Option<usize>) -> PreheatRequest {
        PreheatRequest {
            image: image.into(),
            count,
            labels: BTreeMap::new(),
            platform: None,
            timeout_secs: None,
        }
    }

    fn progress(job: &str, state: pb::PreheatState, done: u64, error: &str) -> pb::PreheatProgress {
        pb::PreheatProgress {
            job_id: job.into(),
            state: state.into(),
            chunks_done: done,
            chunks_total: 10,
            bytes_done: done * 100,
            bytes_total: 1000,
            error: error.into(),
        }
    }

    #[test]
    fn a_job_is_handed_out_until_picked_up_and_succeeds_when_all_hosts_do() {
        let mut p = Preheats::open(None).unwrap();
        let job = p.create(request("reg/app:v1", Some(2)), hosts(5)).unwrap();
        assert_eq!(job.hosts.len(), 2);
        let chosen: Vec<String> = job.hosts.keys().cloned().collect();
        let other = (0..5)
            .map(|i| format!("h{i}"))
            .find(|h| !chosen.contains(h))
            .unwrap();
        assert!(p.heartbeat(&other, &[]).is_empty());
        let tasks = p.heartbeat(&chosen[0], &[]);
        assert_eq!(tasks.len(), 1);
        assert_eq!(tasks[0].image, "reg/app:v1");
        // Given again until the host lists it.
        assert_eq!(p.heartbeat(&chosen[0], &[]).len(), 1);
        let running = progress(&job.id, pb::PreheatState::Running, 3, "");
        assert!(p.heartbeat(&chosen[0], &[running]).is_empty());
        assert_eq!(p.get(&job.id).unwrap().state, State::Running);
        assert_eq!(p.get(&job.id).unwrap().hosts[&chosen[0]].chunks_done, 3);
        let done = progress(&job.id, pb::PreheatState::Succeeded, 10, "");
        p.heartbeat(&chosen[0], std::slice::from_ref(&done));
        assert_eq!(p.get(&job.id).unwrap().state, State::Running);
        p.heartbeat(&chosen[1], &[done]);
        let job = p.get(&job.id).unwrap();
        assert_eq!(job.state, State::Succeeded);
        assert!(job.finished.is_some() && job.error.is_none());
    }

    #[test]
    fn a_failing_or_departed_host_fails_the_job_with_its_reason() {
        let mut p = Preheats::open(None).unwrap();
        let job = p.create(request("reg/app:v1", None), hosts(2)).unwrap();
        assert_eq!(job.hosts.len(), 2);
        let failed = progress(&job.id, pb::PreheatState::Failed, 0, "manifest unknown");
        p.heartbeat("h0", &[failed]);
        assert_eq!(p.get(&job.id).unwrap().state, State::Running);
        let start = Instant::now();
        let grace = Duration::from_secs(60);
        p.tick(|h| h != "h1", grace, start);
        // Not yet: h1 may be restarting (or the scheduler just did).
        assert_eq!(p.get(&job.id).unwrap().state, State::Running);
        p.tick(|h| h != "h1", grace, start + grace);
        let job = p.get(&job.id).unwrap().clone();
        assert_eq!(job.state, State::Failed);
        let error = job.error.as_deref().unwrap();
        assert!(error.contains("h0: manifest unknown"), "{error}");
        assert!(error.contains("h1: the host left the swarm"), "{error}");
        // Finished jobs are not handed out or changed again.
        let late = progress(&job.id, pb::PreheatState::Succeeded, 10, "");
        assert!(p.heartbeat("h0", &[late]).is_empty());
        assert_eq!(p.get(&job.id).unwrap().state, State::Failed);
    }

    #[test]
    fn requests_that_cannot_be_met_are_refused_with_a_reason() {
        let mut p = Preheats::open(None).unwrap();
        for bad in ["", "a b", "/x", "reg//x", "ré/x"] {
            assert!(matches!(
                p.create(request(bad, None), hosts(3)),
                Err(Refusal::Invalid(_))
            ));
        }
        assert!(matches!(
            p.create(request("reg/app:v1", Some(0)), hosts(3)),
            Err(Refusal::Invalid(_))
        ));
        assert!(matches!(
            p.create(request("reg/app:v1", Some(4)), hosts(3)),
            Err(Refusal::NotEnoughHosts(_))
        ));
        assert!(matches!(
            p.create(request("reg/app:v1", None), Vec::new()),
            Err(Refusal::NotEnoughHosts(_))
        ));
        let mut zone_b = request("reg/app:v1", None);
        zone_b.labels.insert("zone".into(), "b".into());
        let job = p.create(zone_b, hosts(5)).unwrap();
        assert_eq!(
            job.hosts.keys().cloned().collect::<Vec<_>>(),
            vec!["h1".to_string(), "h3".to_string()]
        );
        let mut bad_platform = request("reg/app:v1", None);
        bad_platform.platform = Some("linux".into());
        assert!(matches!(
            p.create(bad_platform, hosts(1)),
            Err(Refusal::Invalid(_))
        ));
    }

    fn refusal(p: &mut Preheats, request: PreheatRequest) -> String {
        match p.create(request, hosts(3)) {
            Err(Refusal::Invalid(why)) => why,
            other => panic!("not refused as invalid: {other:?}"),
        }
    }

    #[test]
    fn an_image_that_is_no_oci_reference_is_refused_with_the_parsers_reason() {
        let mut p = Preheats::open(None).unwrap();
        for (bad, reason) in [
            (
                "../../etc/passwd",
                "the registry host is not a valid host[:port]",
            ),
            ("reg.example/App:v1", "repository components are lowercase"),
            ("reg.example/app:-v1", "a tag is"),
            ("reg.example/app@sha256:abc", "the digest must be"),
            ("reg.example/app;rm -rf", "cannot appear"),
        ] {
            let why = refusal(&mut p, request(bad, None));
            assert!(why.starts_with("image: "), "{why}");
            assert!(why.contains(reason), "{bad}: {why}");
            if !reason.contains("appear") {
                assert!(why.contains(&format!("{bad:?}")), "{why}");
            }
        }
        let long = format!("reg.example/{}", "a".repeat(MAX_IMAGE_LEN));
        let why = refusal(&mut p, request(&long, None));
        assert!(why.contains(&format!("not {}", long.len())), "{why}");
        // What agents accept is accepted: Docker Hub short names, ports, digests.
        let digest = format!("sha256:{}", "0".repeat(64));
        for good in [
            "alpine".to_string(),
            "127.0.0.1:5000/team/app:v1.4.2".to_string(),
            format!("reg.example/app@{digest}"),
        ] {
            assert!(
                p.create(request(&good, Some(1)), hosts(3)).is_ok(),
                "{good}"
            );
        }
    }

    #[test]
    fn counts_and_timeouts_out_of_bounds_are_refused_naming_field_and_value() {
        let mut p = Preheats::open(None).unwrap();
        for count in [0, MAX_COUNT + 1, usize::MAX] {
            let why = refusal(&mut p, request("reg/app:v1", Some(count)));
            assert!(why.starts_with("count: "), "{why}");
            assert!(why.ends_with(&format!("not {count}")), "{why}");
        }
        // Within bounds but more than there are hosts: a conflict, not a bad request.
        assert!(matches!(
            p.create(request("reg/app:v1", Some(MAX_COUNT)), hosts(3)),
            Err(Refusal::NotEnoughHosts(_))
        ));
        let with_timeout = |secs: u64| PreheatRequest {
            timeout_secs: Some(secs),
            ..request("reg/app:v1", None)
        };
        for secs in [0, MAX_TIMEOUT.as_secs() + 1, u64::MAX] {
            let why = refusal(&mut p, with_timeout(secs));
            assert!(why.starts_with("timeout_secs: "), "{why}");
            assert!(why.ends_with(&format!("not {secs}")), "{why}");
        }
        for secs in [1, MAX_TIMEOUT.as_secs()] {
            let job = p.create(with_timeout(secs), hosts(3)).unwrap();
            assert_eq!(job.timeout_secs, secs);
        }
        let job = p.create(request("reg/app:v1", None), hosts(3)).unwrap();
        assert_eq!(job.timeout_secs, DEFAULT_TIMEOUT.as_secs());
    }

    #[test]
    fn jobs_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let id = {
            let mut p = Preheats::open(Some(Store::open(dir.path()).unwrap())).unwrap();
            let job = p.create(request("reg/app:v1", Some(1)), hosts(1)).unwrap();
            p.heartbeat("h0", &[progress(&job.id, pb::PreheatState::Running, 1, "")]);
            job.id
        };
        let mut p = Preheats::open(Some(Store::open(dir.path()).unwrap())).unwrap();
        assert_eq!(p.get(&id).unwrap().state, State::Running);
        // A restarted agent that lost the job is given it again.
        assert_eq!(p.heartbeat("h0", &[]).len(), 1);
    }
}
