// Package natslease is the lease.Authority of a deployment: the tables of
// the global ceilings (budgets/lease) in a JetStream key-value bucket,
// which every region reads and writes back with compare-and-set on the
// key's revision. The regions are NATS clusters joined as a supercluster by
// gateway links; the bucket lives in one of them (Options.Placement), its
// replicas within that cluster.
//
// # Keys and revisions
//
// A ceiling key ("tenant:acme:rate") is stored under its unpadded URL-safe
// base64: KV keys allow only letters, digits and "-/_=.", and a tenant may
// be named anything. The encoding is one-to-one, so no two ceilings share a
// key. A table's revision is its key's revision, the bucket stream's
// sequence; a create-only write that finds a table (jetstream.ErrKeyExists)
// and a write at a stale revision (jetstream.ErrKeyRevisionMismatch) are
// lease.ErrConflict, which lease.RenewAt answers by reading again.
//
// # A region cut off from the bucket
//
// What JetStream does, as the supercluster test shows with real servers
// (nats-server 2.15) and a fault proxy on the gateway links:
//
//   - Reads and writes of an existing bucket need only the bucket's own
//     servers: its stream leader (with its Raft group, when replicated)
//     orders the compare-and-set writes and answers the reads. They do not
//     need the JetStream meta leader. The region that holds the bucket
//     keeps renewing when the others are cut off, and keeps renewing when
//     the meta layer itself has lost its quorum (its peers are every
//     JetStream server of the supercluster; a cut leaves a side without a
//     majority, and with two regions neither side has one).
//   - Creating a bucket needs the meta leader: with the meta layer cut in
//     two, New cannot create it (binding to one that exists still works
//     from the bucket's own region: its stream leader answers).
//   - A region cut off from the bucket's cluster cannot renew. While the
//     servers have not yet noticed the link is dead (a network dropping
//     packets: a gateway is pinged at most every 15 s and dropped after
//     two unanswered pings, some 40 s with the defaults), a request gets
//     no reply and fails at its context deadline;
//     once the link is dropped, nothing in the region answers the bucket's
//     subjects and a request fails at once with nats.ErrNoResponders. Either
//     way the renewal fails within its deadline (give every renewal one;
//     without, the JetStream context's default timeout, 5 s, applies) and the region spends
//     its last grant until its expiry, then its safe share (lease.Spending)
//     — which the authority has kept reserved for it, so the bucket's
//     region is granted no more than the rest. A region that restarts
//     while cut off cannot bind to the bucket and renews nothing: it spends
//     its safe share until it can.
//   - When the link heals, the gateways reconnect and the region renews
//     again (a few seconds after the proxy healed, in the test).
//
// So Placement decides which region keeps renewing in a partition: put
// the bucket in the region with the most traffic, or the one most often on
// the majority side. If the bucket's own cluster loses its quorum (a
// replicated bucket with most of its servers down), no region renews, and
// every region falls to its safe share at its lease's expiry.
// (docs/architecture.md §14, "The authority".)
package natslease
