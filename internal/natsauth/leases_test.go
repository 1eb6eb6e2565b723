package natsauth

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/schemas"
)

// leasesBucket is the leases' bucket of these tests (natslease's default).
const leasesBucket = "hedgerow_leases"

// Only gateways may write lease state (docs/architecture.md §13, §14): a
// client, worker or observer that could write the leases' table would
// grant its region the whole of a global ceiling. Their writes to the
// bucket's keys and its JetStream API are refused by the server and leave
// the table as the gateway wrote it.
func TestOnlyTheGatewayUserMayWriteLeaseState(t *testing.T) {
	s := spec()
	s.LeasesBucket = leasesBucket
	b, err := Generate(s)
	if err != nil {
		t.Fatal(err)
	}
	dir, loaded := writeAndLoad(t, b)
	ns := natstest.Start(t, natstest.JetStream(t.TempDir()), func(o *server.Options) { o.Nkeys = loaded.Nkeys })
	ctx, cancel := context.WithTimeout(context.Background(), busWait)
	defer cancel()

	gw := connectAs(t, b, dir, ns, UserGateway, nil)
	js, err := jetstream.New(gw)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: leasesBucket})
	if err != nil {
		t.Fatalf("the gateway could not create the leases' bucket: %v", err)
	}
	if _, err := kv.Put(ctx, "tenant_rate.t1", []byte("granted by the authority")); err != nil {
		t.Fatalf("the gateway could not write a lease: %v", err)
	}

	forbidden := []string{
		"$KV." + leasesBucket + ".tenant_rate.t1",
		"$JS.API.STREAM.CREATE.KV_" + leasesBucket,
		"$JS.API.STREAM.UPDATE.KV_" + leasesBucket,
		"$JS.API.STREAM.PURGE.KV_" + leasesBucket,
		"$JS.API.STREAM.DELETE.KV_" + leasesBucket,
		// Nor forge a committed user action, or the region's heartbeat.
		schemas.RegionWire("").ActionSubject("0123abcd"),
		schemas.RegionWire("").ActionHeartbeatSubject(),
		"$JS.API.STREAM.UPDATE.hedgerow_actions",
		"$JS.API.STREAM.CREATE.hedgerow_actions_seen",
	}
	for _, user := range []string{"alice", "wab", UserObserver} {
		t.Run(user, func(t *testing.T) {
			v := newViolations()
			nc := connectAs(t, b, dir, ns, user, v)
			for _, subject := range forbidden {
				if err := nc.Publish(subject, []byte(`{"share":1}`)); err != nil {
					t.Fatal(err)
				}
			}
			for _, subject := range forbidden {
				v.waitForPublish(t, subject)
			}
		})
	}
	e, err := kv.Get(ctx, "tenant_rate.t1")
	if err != nil {
		t.Fatal(err)
	}
	if string(e.Value()) != "granted by the authority" || e.Revision() != 1 {
		t.Errorf("the lease is %q at revision %d, want the gateway's at revision 1", e.Value(), e.Revision())
	}
}

// Without global.regions no user, the gateway included, may touch a
// leases' bucket.
func TestNoUserMayTouchTheLeasesBucketWithoutRegions(t *testing.T) {
	b, err := Generate(spec())
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range b.Users {
		if i := slices.IndexFunc(u.Permissions.Publish, func(s string) bool { return strings.Contains(s, leasesBucket) }); i >= 0 {
			t.Errorf("%s may publish %q", u.Name, u.Permissions.Publish[i])
		}
	}
}

// connectAs connects to ns as b's user name (connectUser).
func connectAs(t *testing.T, b *Bundle, dir string, ns *server.Server, name string, v *violations) *nats.Conn {
	t.Helper()
	return connectUser(t, b, dir, ns.ClientURL(), name, v)
}
