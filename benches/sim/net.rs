//! Flow-level bandwidth sharing, cheap enough for thousands of hosts.
//!
//! A transfer is a *flow* of bytes from a host (or the origin) to a host. Its rate is
//! the smallest of the shares it gets of each resource it crosses:
//!
//! - the sender's uplink divided by the sender's active uploads (the origin's link
//!   divided by the origin's active flows),
//! - the receiver's downlink divided by the receiver's active downloads,
//! - when a machine-wide CPU capacity is set (the one-machine testbed), that capacity
//!   divided by every active flow.
//!
//! This is not max-min fairness: a flow held back by its receiver leaves part of its
//! sender's share unused instead of handing it to the sender's other flows. It is
//! chosen because a flow starting or ending changes only the rates of flows sharing its
//! sender or receiver (and the origin's flows, or all flows under the CPU cap), so an
//! event costs the size of two hosts' flow lists, not the whole network's: N = 5,000
//! stays cheap. It underestimates throughput where shares are uneven (pessimistic).

/// Where a flow's bytes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum From {
    Host(u32),
    Origin,
}

#[derive(Debug)]
struct Flow {
    from: From,
    to: u32,
    /// Bytes still to send as of `since`.
    remaining: f64,
    /// Bytes per second since `since`.
    rate: f64,
    since: f64,
    /// Bumped whenever the finish time changes: a finish event carrying an older
    /// version is stale.
    version: u32,
    live: bool,
    /// Who the flow is for (the caller's run).
    tag: u32,
}

/// A finish time to schedule: flow, version, time.
pub type Finish = (u32, u32, f64);

/// Hosts' links, the origin's link, an optional machine-wide CPU capacity, and the
/// flows over them.
pub struct Net {
    up_bps: Vec<f64>,
    down_bps: Vec<f64>,
    uploads: Vec<Vec<u32>>,
    downloads: Vec<Vec<u32>>,
    origin_bps: f64,
    origin_flows: Vec<u32>,
    cpu_bps: Option<f64>,
    live: Vec<u32>,
    flows: Vec<Flow>,
    free: Vec<u32>,
    /// Bytes the origin sent.
    pub origin_bytes: u64,
}

impl Net {
    pub fn new(
        hosts: usize,
        up_bps: f64,
        down_bps: f64,
        origin_bps: f64,
        cpu_bps: Option<f64>,
    ) -> Self {
        Net {
            up_bps: vec![up_bps; hosts],
            down_bps: vec![down_bps; hosts],
            uploads: vec![Vec::new(); hosts],
            downloads: vec![Vec::new(); hosts],
            origin_bps,
            origin_flows: Vec::new(),
            cpu_bps,
            live: Vec::new(),
            flows: Vec::new(),
            free: Vec::new(),
            origin_bytes: 0,
        }
    }

    pub fn tag(&self, flow: u32) -> u32 {
        self.flows[flow as usize].tag
    }

    pub fn is_current(&self, flow: u32, version: u32) -> bool {
        let f = &self.flows[flow as usize];
        f.live && f.version == version
    }

    /// Starts a flow of `bytes`; the finish times that changed (its own among them).
    pub fn start(
        &mut self,
        from: From,
        to: u32,
        bytes: u64,
        tag: u32,
        now: f64,
        out: &mut Vec<Finish>,
    ) -> u32 {
        let flow = Flow {
            from,
            to,
            remaining: bytes as f64,
            rate: 0.0,
            since: now,
            version: 0,
            live: true,
            tag,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.flows[id as usize] = flow;
                id
            }
            None => {
                self.flows.push(flow);
                (self.flows.len() - 1) as u32
            }
        };
        match from {
            From::Host(h) => self.uploads[h as usize].push(id),
            From::Origin => {
                self.origin_flows.push(id);
                self.origin_bytes += bytes;
            }
        }
        self.downloads[to as usize].push(id);
        if self.cpu_bps.is_some() {
            self.live.push(id);
        }
        self.reshare(from, to, now, out);
        id
    }

    /// Ends a finished flow; the finish times of others that changed.
    pub fn finish(&mut self, id: u32, now: f64, out: &mut Vec<Finish>) {
        let (from, to) = {
            let f = &mut self.flows[id as usize];
            f.live = false;
            (f.from, f.to)
        };
        let remove = |list: &mut Vec<u32>| {
            if let Some(i) = list.iter().position(|&x| x == id) {
                list.swap_remove(i);
            }
        };
        match from {
            From::Host(h) => remove(&mut self.uploads[h as usize]),
            From::Origin => remove(&mut self.origin_flows),
        }
        remove(&mut self.downloads[to as usize]);
        if self.cpu_bps.is_some() {
            remove(&mut self.live);
        }
        self.free.push(id);
        self.reshare(from, to, now, out);
    }

    fn rate(&self, f: &Flow) -> f64 {
        let sender = match f.from {
            From::Host(h) => self.up_bps[h as usize] / self.uploads[h as usize].len().max(1) as f64,
            From::Origin => self.origin_bps / self.origin_flows.len().max(1) as f64,
        };
        let receiver =
            self.down_bps[f.to as usize] / self.downloads[f.to as usize].len().max(1) as f64;
        let cpu = self
            .cpu_bps
            .map_or(f64::INFINITY, |c| c / self.live.len().max(1) as f64);
        sender.min(receiver).min(cpu)
    }

    /// Recomputes the rates of the flows sharing `from` or `to` (every flow under the
    /// CPU cap), rescheduling those whose rate changed.
    fn reshare(&mut self, from: From, to: u32, now: f64, out: &mut Vec<Finish>) {
        let mut touched: Vec<u32> = Vec::new();
        if self.cpu_bps.is_some() {
            touched.extend_from_slice(&self.live);
        } else {
            match from {
                From::Host(h) => touched.extend_from_slice(&self.uploads[h as usize]),
                From::Origin => touched.extend_from_slice(&self.origin_flows),
            }
            touched.extend_from_slice(&self.downloads[to as usize]);
        }
        for id in touched {
            let rate = self.rate(&self.flows[id as usize]);
            let f = &mut self.flows[id as usize];
            if rate == f.rate {
                continue;
            }
            f.remaining = (f.remaining - f.rate * (now - f.since)).max(0.0);
            f.since = now;
            f.rate = rate;
            f.version = f.version.wrapping_add(1);
            out.push((id, f.version, now + f.remaining / rate));
        }
    }
}
