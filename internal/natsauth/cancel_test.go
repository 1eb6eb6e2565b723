package natsauth

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/schemas"
)

// busWait bounds every wait for the server; reaching it is a failure.
const busWait = 10 * time.Second

// Cancels belong to their caller (docs/architecture.md §8): a client user
// may publish cancels only on the subjects naming it, which the gateway
// hears; another user's, and the form naming no user, never leave the
// server.
func TestAClientUserMayPublishCancelsOnlyUnderItsOwnName(t *testing.T) {
	b, err := Generate(spec()) // clients alice and bob
	if err != nil {
		t.Fatal(err)
	}
	dir, loaded := writeAndLoad(t, b)
	ns := natstest.Start(t, func(o *server.Options) { o.Nkeys = loaded.Nkeys })
	as := func(user, inbox string, opts ...nats.Option) *nats.Conn {
		t.Helper()
		seed, err := nats.NkeyOptionFromSeed(filepath.Join(dir, user+".nk"))
		if err != nil {
			t.Fatal(err)
		}
		return natstest.Connect(t, ns, append(opts, seed, nats.CustomInboxPrefix(inbox))...)
	}
	gw := as(UserGateway, schemas.GatewayInboxPrefix)
	heard, err := gw.SubscribeSync(schemas.SubmitCancelPrefix + ">")
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Flush(); err != nil {
		t.Fatal(err)
	}
	denied := make(chan string, 4)
	alice := as("alice", schemas.ClientInbox("alice"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		denied <- err.Error()
	}))
	id := strings.Repeat("ab", 16)
	forbidden := []string{schemas.SubmitCancelUserSubject("bob", id), schemas.SubmitCancelSubject(id)}
	for _, subject := range forbidden {
		if err := alice.Publish(subject, nil); err != nil {
			t.Fatal(err)
		}
	}
	own := schemas.SubmitCancelSubjectFor(alice.NewInbox(), id)
	if own != schemas.SubmitCancelUserSubject("alice", id) {
		t.Fatalf("alice's cancel subject %q, want the one naming her", own)
	}
	if err := alice.Publish(own, nil); err != nil {
		t.Fatal(err)
	}
	// One connection's messages arrive in order: the first the gateway
	// hears is alice's own cancel, so the two before it were dropped.
	m, err := heard.NextMsg(busWait)
	if err != nil {
		t.Fatalf("the gateway never heard alice's own cancel: %v", err)
	}
	if m.Subject != own {
		t.Fatalf("the gateway heard %q first, want alice's own %q", m.Subject, own)
	}
	var errs []string
	for range forbidden {
		select {
		case e := <-denied:
			errs = append(errs, e)
		case <-time.After(busWait):
			t.Fatalf("permissions violations %q, want one for each of %q", errs, forbidden)
		}
	}
	for _, subject := range forbidden {
		found := false
		for _, e := range errs {
			found = found || strings.Contains(strings.ToLower(e), "permissions violation") && strings.Contains(e, `"`+subject+`"`)
		}
		if !found {
			t.Errorf("no permissions violation for %q among %q", subject, errs)
		}
	}
}
