//! `inproc`: the bench program with no transport at all. Each call is
//! encoded with the bench client encoder, dispatched by the dataplane's
//! [`ServiceTable`] on the caller's thread into a per-slot reply buffer,
//! and decoded by [`drive`](crate::driver::drive) like any other reply.
//!
//! It is the software floor of an RPC on this machine (XDR encode,
//! dispatch, the service, decode, one copy of the data each way), next to
//! the physical floor of `floor`, and the reference implementation of
//! [`RpcDriver`]: everything is allocated in [`prepare`](RpcDriver::prepare),
//! nothing per call. The server's work runs on the client's thread, so its
//! CPU time is inside the client's and `server_cpu` is `None`.

use dataplane::service::bench::{encode_call, Args};
use dataplane::service::{Dispatch, ServiceTable};

use crate::driver::{Reply, RpcDriver};
use crate::tirpc::CpuTimes;
use crate::transport::{BenchError, RunSpec};

/// Room for the RPC headers around the data in each buffer.
const HEADER_ROOM: usize = 512;

/// The in-process driver.
pub struct InProc {
    table: ServiceTable,
    xid: u32,
    calls: Vec<Vec<u8>>,
    replies: Vec<Vec<u8>>,
    reply_len: Vec<usize>,
    ready: Vec<u32>,
}

impl InProc {
    /// A driver over the built-in service table.
    pub fn new() -> InProc {
        InProc {
            table: ServiceTable::builtin(),
            xid: 0,
            calls: Vec::new(),
            replies: Vec::new(),
            reply_len: Vec::new(),
            ready: Vec::new(),
        }
    }
}

impl Default for InProc {
    fn default() -> Self {
        InProc::new()
    }
}

impl RpcDriver for InProc {
    fn name(&self) -> &'static str {
        "inproc"
    }

    fn describe(&self) -> String {
        "inproc: the bench service called on the client's thread, no transport".to_owned()
    }

    fn prepare(&mut self, spec: &RunSpec) -> Result<(), BenchError> {
        let depth = spec.depth.max(1) as usize;
        let len = spec.size as usize + HEADER_ROOM;
        self.calls = vec![vec![0u8; len]; depth];
        self.replies = vec![vec![0u8; len]; depth];
        self.reply_len = vec![0; depth];
        self.ready = Vec::with_capacity(depth);
        Ok(())
    }

    fn start(&mut self, slot: u32, args: Args<'_>) -> Result<(), BenchError> {
        let s = slot as usize;
        let fail = |reason: String| BenchError::Call {
            transport: "inproc",
            reason,
        };
        let (call, reply) = match (self.calls.get_mut(s), self.replies.get_mut(s)) {
            (Some(c), Some(r)) => (c, r),
            _ => return Err(fail(format!("slot {slot} beyond the prepared depth"))),
        };
        self.xid = self.xid.wrapping_add(1);
        let encoded = encode_call(call, self.xid, args).map_err(|e| fail(e.to_string()))?;
        match self.table.dispatch(&call[..encoded.len], reply) {
            Dispatch::Reply { len, .. } => {
                self.reply_len[s] = len;
                self.ready.push(slot);
                Ok(())
            }
            Dispatch::Drop => Err(fail("the service table dropped the call".to_owned())),
        }
    }

    fn poll<F: FnMut(u32, Reply<'_>)>(&mut self, mut done: F) -> Result<usize, BenchError> {
        let n = self.ready.len();
        for &slot in &self.ready {
            let s = slot as usize;
            done(
                slot,
                Reply {
                    message: &self.replies[s][..self.reply_len[s]],
                    ddp: None,
                },
            );
        }
        self.ready.clear();
        Ok(n)
    }

    fn server_cpu(&self) -> Option<CpuTimes> {
        None
    }
}
