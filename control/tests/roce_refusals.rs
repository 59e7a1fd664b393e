//! The roce provider's own refusals reach the daemon's metrics: a flood
//! of connection requests from one address that never complete (no RTU)
//! gets its requests past the per-address half-open bound rejected by the
//! provider's connection manager, and the daemon counts them in
//! `rpcrdma_listener_rejected_total{reason="half_open"}`.
mod support;

use std::net::{Ipv4Addr, SocketAddr};

use support::*;

#[test]
fn a_req_flood_from_one_address_shows_as_half_open_refusals() {
    let dir = scratch_dir("roce-refusals");
    let (server, flooder) = (Ipv4Addr::new(127, 0, 0, 66), Ipv4Addr::new(127, 0, 0, 67));
    let port = 20661;
    let url = format!("roce://{server}:{port}");
    let metrics: SocketAddr = "127.0.0.1:19506".parse().unwrap();
    let cfg = write_file(
        &dir,
        "roce.toml",
        &format!(
            "[[listeners]]\nurl = \"{url}\"\n\n[workers]\ncores = [0]\nidle = \"adaptive\"\n\n\
             [metrics]\naddress = \"{metrics}\"\n\n[rpcbind]\nregister = false\n\n\
             [control]\nsocket = \"{}/ctl.sock\"\n",
            dir.display()
        ),
    );
    let mut d = Daemon::spawn(&["--config", cfg.to_str().unwrap()]);
    d.wait_for_line("started");

    // Requests from one address, each a new connection, none completed
    // (the socket stays open until the daemon has answered).
    const FLOOD: u32 = 40;
    let _sock = roce_reqs::flood_reqs(flooder, server, port, FLOOD, 0x7000);

    let name =
        format!("rpcrdma_listener_rejected_total{{listener=\"{url}\",reason=\"half_open\"}}");
    let body = scrape_until(metrics, &name, 1);
    let refused = metric(&body, &name);
    assert!(refused >= 1 && refused <= u64::from(FLOOD), "{body}");
    d.wait_for_line("half-open");
    promtool_accepts(&body);
    d.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(d.wait().code(), Some(0), "{}", d.stderr());
    let _ = std::fs::remove_dir_all(dir);
}
