//! Peer-to-peer between agents. Today: the serving side, [`server::PeerServer`], which
//! streams chunks from this node's verified cache to other agents. The fetching side
//! (a peer source in `fetch`, announcements to the scheduler) comes next.

pub mod server;
