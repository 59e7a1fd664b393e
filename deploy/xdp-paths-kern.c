/* The XDP program deploy/xdp-paths attaches to the receiving veth for its
 * xsk modes: each frame goes to the AF_XDP socket in the map slot of the
 * queue it came in on; while no socket sits there, to the stack as usual.
 *
 * It is in section "xdp.frags" (libbpf then loads it as handling frames
 * in several buffers) because the frames are 4,166 bytes at MTU 9000, and
 * a veth refuses a program without it once the peer's MTU is above about
 * 3,500 bytes (measured: 3,506 accepted, 3,508 refused). */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
    __uint(type, BPF_MAP_TYPE_XSKMAP);
    __uint(max_entries, 1); /* the veth has one queue */
    __type(key, int);
    __type(value, int);
} xsks SEC(".maps");

SEC("xdp.frags")
int xsk_redirect(struct xdp_md *ctx)
{
    /* The low bits of the flags are the action when the slot is empty. */
    return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
}

char _license[] SEC("license") = "Dual MIT/GPL";
