package natsdoor

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/client"
	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/natsauth"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/schemas"
)

// Cancels belong to their caller (docs/architecture.md §8): these tests run
// the door on a NATS server loading the authorization `hedgerow nats-auth`
// generates, with client users alice and bob, and tenants acme and other.

// heldRuntime holds every submission until release closes (then answers
// ok) or its caller leaves (then reports it on gone).
type heldRuntime struct {
	arrived chan dispatcher.Submission
	gone    chan dispatcher.Submission
	release chan struct{}
}

func newHeldRuntime() *heldRuntime {
	return &heldRuntime{arrived: make(chan dispatcher.Submission, 8), gone: make(chan dispatcher.Submission, 8), release: make(chan struct{})}
}

func (h *heldRuntime) script(ctx context.Context, sub dispatcher.Submission, _ dispatcher.Sink) (*dispatcher.Response, error) {
	h.arrived <- sub
	select {
	case <-h.release:
		return &dispatcher.Response{Content: "ok"}, nil
	case <-ctx.Done():
		h.gone <- sub
		return nil, ctx.Err()
	}
}

// waitArrived waits for the next submission to reach the runtime.
func (h *heldRuntime) waitArrived(t *testing.T) dispatcher.Submission {
	t.Helper()
	select {
	case sub := <-h.arrived:
		return sub
	case <-time.After(natsWait):
		t.Fatal("the request never reached the runtime")
		return dispatcher.Submission{}
	}
}

// ownedDoor is a door whose callers are NATS users of the generated
// authorization, each on its own connection, and tenants of its keyring.
type ownedDoor struct {
	svc     *Service
	sub     *frontdoortest.Submitter
	runtime *heldRuntime
	reg     *prometheus.Registry
	users   map[string]*caller
}

// caller is a client user's connection and the permission errors the
// server sent it.
type caller struct {
	nc     *nats.Conn
	denied chan string
}

func startOwnedDoor(t *testing.T, opts Options) *ownedDoor {
	t.Helper()
	b, err := natsauth.Generate(natsauth.Spec{Routes: []string{"r"}, Clients: []string{"alice", "bob"},
		Responses: natsauth.ResponsesFor(5*time.Second, 50*time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := b.Write(dir); err != nil {
		t.Fatal(err)
	}
	loaded, err := server.ProcessConfigFile(filepath.Join(dir, natsauth.ServerConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	ns := natstest.Start(t, func(o *server.Options) { o.Nkeys = loaded.Nkeys })
	connect := func(user, inbox string, opts ...nats.Option) *nats.Conn {
		t.Helper()
		seed, err := nats.NkeyOptionFromSeed(filepath.Join(dir, user+".nk"))
		if err != nil {
			t.Fatal(err)
		}
		return natstest.Connect(t, ns, append(opts, seed, nats.CustomInboxPrefix(inbox))...)
	}
	d := &ownedDoor{runtime: newHeldRuntime(), reg: prometheus.NewPedanticRegistry(), users: map[string]*caller{}}
	for _, user := range []string{"alice", "bob"} {
		c := &caller{denied: make(chan string, 8)}
		c.nc = connect(user, schemas.ClientInbox(user), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			c.denied <- err.Error()
		}))
		d.users[user] = c
	}
	opts.Keyring = frontdoor.NewKeyring(map[string][]string{
		"acme": {policy.HashAPIKey(frontdoortest.AcmeKey)}, "other": {policy.HashAPIKey(frontdoortest.OtherKey)}})
	opts.Registerer = d.reg
	d.sub = frontdoortest.New(d.runtime.script)
	if d.svc, err = Start(d.sub, connect(natsauth.UserGateway, schemas.GatewayInboxPrefix), opts); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), natsWait)
		defer cancel()
		if err := d.svc.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return d
}

// submit sends a request of user with the API key key and request id id;
// its answers arrive on the subscription returned.
func (d *ownedDoor) submit(t *testing.T, user, key, id string) *nats.Subscription {
	t.Helper()
	nc := d.users[user].nc
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	h := bearer(key)
	h.Set(schemas.HeaderRequestID, id)
	if err := nc.PublishMsg(&nats.Msg{Subject: schemas.SubmitSubject, Reply: inbox, Header: h, Data: submitBody(t, false)}); err != nil {
		t.Fatal(err)
	}
	return sub
}

// cancel publishes a cancel as user on subject, with the API key key
// (none when empty).
func (d *ownedDoor) cancel(t *testing.T, user, key, subject string) {
	t.Helper()
	msg := &nats.Msg{Subject: subject}
	if key != "" {
		msg.Header = bearer(key)
	}
	nc := d.users[user].nc
	if err := nc.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// remembered reports whether the door keeps an early cancel under k.
func (d *ownedDoor) remembered(k callKey) func(*testing.T) bool {
	return func(*testing.T) bool {
		d.svc.mu.Lock()
		defer d.svc.mu.Unlock()
		_, ok := d.svc.early.byOwner[k.owner][k.id]
		return ok
	}
}

// rejected is the door's count of cancels refused for reason.
func (d *ownedDoor) rejected(t *testing.T, reason string) float64 {
	t.Helper()
	return rejectedCancels(t, d.reg, reason)
}

func rejectedCancels(t *testing.T, reg prometheus.Gatherer, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "hedgerow_nats_cancels_rejected_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "reason" && lp.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no series hedgerow_nats_cancels_rejected_total{reason=%q}", reason)
	return 0
}

// deniedTo waits for the server's permissions violation for subject on
// user's connection: the message never reached a gateway.
func (d *ownedDoor) deniedTo(user, subject string) func(*testing.T) bool {
	return func(t *testing.T) bool {
		select {
		case e := <-d.users[user].denied:
			if strings.Contains(strings.ToLower(e), "permissions violation") && strings.Contains(e, `"`+subject+`"`) {
				return true
			}
			t.Errorf("%s's connection: async error %q, want a permissions violation for %q", user, e, subject)
			return false
		case <-time.After(natsWait):
			t.Fatalf("no permissions violation for %q on %s's connection", subject, user)
			return false
		}
	}
}

// answeredCanceled waits for the final answer on sub and checks it is
// canceled (499).
func answeredCanceled(t *testing.T, sub *nats.Subscription) {
	t.Helper()
	m, err := sub.NextMsg(natsWait)
	if err != nil {
		t.Fatalf("no final answer: %v", err)
	}
	errorAnswer(t, m, schemas.ErrCanceled, frontdoor.StatusClientClosedRequest)
}

func TestACancelFromAnyoneButTheRequestsOwnerIsRefusedAndTheOwnersIsAnsweredCanceled(t *testing.T) {
	d := startOwnedDoor(t, Options{})
	const id = "job-43" // predictable: the tenant and the user prove the owner
	victim := d.submit(t, "alice", frontdoortest.AcmeKey, id)
	if sub := d.runtime.waitArrived(t); sub.Tenant != "acme" {
		t.Fatalf("submission of tenant %q, want acme", sub.Tenant)
	}
	victimKey := callKey{owner{"acme", "alice"}, id}
	forgeries := []struct {
		name, user, key, subject string
		// refused reports whether the door (or the server) has refused it.
		refused func(*testing.T) bool
	}{
		{"another tenant's caller on its own subject", "bob", frontdoortest.OtherKey, schemas.SubmitCancelUserSubject("bob", id),
			d.remembered(callKey{owner{"other", "bob"}, id})},
		{"the owner's user with another tenant's key", "alice", frontdoortest.OtherKey, schemas.SubmitCancelUserSubject("alice", id),
			d.remembered(callKey{owner{"other", "alice"}, id})},
		{"the owner's tenant key from another user", "bob", frontdoortest.AcmeKey, schemas.SubmitCancelUserSubject("bob", id),
			d.remembered(callKey{owner{"acme", "bob"}, id})},
		{"the owner's user without a key", "alice", "", schemas.SubmitCancelUserSubject("alice", id),
			func(t *testing.T) bool { return d.rejected(t, RejectUnauthenticated) == 1 }},
		{"another user on the owner's subject", "bob", frontdoortest.AcmeKey, schemas.SubmitCancelUserSubject("alice", id),
			d.deniedTo("bob", schemas.SubmitCancelUserSubject("alice", id))},
		{"another user on the subject naming no user", "bob", frontdoortest.AcmeKey, schemas.SubmitCancelSubject(id),
			d.deniedTo("bob", schemas.SubmitCancelSubject(id))},
	}
	for _, f := range forgeries {
		t.Run(f.name, func(t *testing.T) {
			d.cancel(t, f.user, f.key, f.subject)
			eventually.True(t, natsWait, "the cancel to be refused", func() bool { return f.refused(t) })
			d.svc.mu.Lock()
			c := d.svc.byID[victimKey]
			cancelled := c == nil || c.canceledByCaller
			d.svc.mu.Unlock()
			select {
			case <-d.runtime.gone:
				cancelled = true
			default:
			}
			if cancelled {
				t.Fatal("the victim's request was cancelled")
			}
		})
	}
	if m, err := victim.NextMsg(0); err == nil {
		t.Fatalf("the victim was answered %v while its request ran", m.Header)
	}
	d.cancel(t, "alice", frontdoortest.AcmeKey, schemas.SubmitCancelSubjectFor(d.users["alice"].nc.NewInbox(), id))
	select {
	case <-d.runtime.gone:
	case <-time.After(natsWait):
		t.Fatal("the owner's cancel never reached the submission")
	}
	answeredCanceled(t, victim)
}

// A cancel sent before its request (job-42) is remembered under its
// sender: another owner's neither drops nor cancels the request; the
// owner's answers it canceled, running nothing.
func TestAnEarlyCancelCancelsOnlyItsOwnersRequestOnArrival(t *testing.T) {
	d := startOwnedDoor(t, Options{})
	const id = "job-42"
	d.cancel(t, "bob", frontdoortest.OtherKey, schemas.SubmitCancelUserSubject("bob", id))
	eventually.True(t, natsWait, "bob's cancel to be remembered as his", func() bool { return d.remembered(callKey{owner{"other", "bob"}, id})(t) })
	victim := d.submit(t, "alice", frontdoortest.AcmeKey, id)
	d.runtime.waitArrived(t)
	close(d.runtime.release)
	m, err := victim.NextMsg(natsWait)
	if err != nil {
		t.Fatalf("no answer to the request another owner pre-cancelled: %v", err)
	}
	answered(t, m)

	const own = "job-44"
	d.cancel(t, "alice", frontdoortest.AcmeKey, schemas.SubmitCancelUserSubject("alice", own))
	eventually.True(t, natsWait, "alice's cancel to be remembered", func() bool { return d.remembered(callKey{owner{"acme", "alice"}, own})(t) })
	answeredCanceled(t, d.submit(t, "alice", frontdoortest.AcmeKey, own))
	if n := len(d.sub.Submissions()); n != 1 {
		t.Fatalf("%d submissions ran, want only job-42's", n)
	}
}

// Request ids are scoped per owner: another owner's request of the same
// id runs beside it, and only the owner learns its own id is in flight.
func TestARequestIDNamesARequestOfItsOwnerOnly(t *testing.T) {
	d := startOwnedDoor(t, Options{})
	const id = "job-7"
	d.submit(t, "alice", frontdoortest.AcmeKey, id)
	d.runtime.waitArrived(t)
	for _, other := range []struct{ user, key string }{
		{"bob", frontdoortest.OtherKey},   // another user and tenant
		{"bob", frontdoortest.AcmeKey},    // the same tenant, another user
		{"alice", frontdoortest.OtherKey}, // the same user, another tenant
	} {
		d.submit(t, other.user, other.key, id)
		d.runtime.waitArrived(t)
	}
	again := d.submit(t, "alice", frontdoortest.AcmeKey, id)
	m, err := again.NextMsg(natsWait)
	if err != nil {
		t.Fatal(err)
	}
	if msg := errorAnswer(t, m, schemas.ErrInvalidRequest, 400); strings.Contains(msg, id) {
		t.Errorf("the refusal %q echoes the id", msg)
	}
	close(d.runtime.release)
}

// The Go client cancels as its caller: a request abandoned by its context
// is cancelled at the gateway, through the generated permissions.
func TestTheGoClientsCancelIsHonouredAsItsOwners(t *testing.T) {
	d := startOwnedDoor(t, Options{})
	c, err := client.New(d.users["alice"].nc, client.WithAPIKey(frontdoortest.AcmeKey))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.Submit(ctx, client.Request{ModelClass: "general", Request: chat(false)})
		done <- err
	}()
	d.runtime.waitArrived(t)
	cancel()
	select {
	case <-d.runtime.gone:
	case <-time.After(natsWait):
		t.Fatal("the client's cancel never reached the submission")
	}
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Submit = %v, want context.Canceled", err)
	}
	select {
	case e := <-d.users["alice"].denied:
		t.Fatalf("the client's cancel was denied: %s", e)
	default:
	}
}

// blockingLimiter holds each admission until unblock closes.
type blockingLimiter struct {
	entered chan struct{}
	unblock chan struct{}
}

func (l *blockingLimiter) Admit(ctx context.Context, _ string) (func(), error) {
	l.entered <- struct{}{}
	select {
	case <-l.unblock:
		return func() {}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func TestACancelOfARequestAdmittedButNotYetRunningIsAnsweredCanceled(t *testing.T) {
	l := &blockingLimiter{entered: make(chan struct{}, 1), unblock: make(chan struct{})}
	d := startDoor(t, frontdoortest.Answer(&dispatcher.Response{Content: "ok"}, false), Options{Limiter: l})
	inbox := d.nc.NewInbox()
	sub, err := d.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := d.nc.PublishMsg(&nats.Msg{Subject: schemas.SubmitSubject, Reply: inbox,
		Header: nats.Header{schemas.HeaderRequestID: {anonymousID}}, Data: submitBody(t, false)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.entered:
	case <-time.After(natsWait):
		t.Fatal("the request never reached its tenant's admission")
	}
	if err := d.nc.Publish(schemas.SubmitCancelSubjectFor(inbox, anonymousID), nil); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, natsWait, "the cancel to mark the admitted request", func() bool {
		d.svc.mu.Lock()
		defer d.svc.mu.Unlock()
		c := d.svc.byID[callKey{owner{}, anonymousID}]
		return c != nil && c.canceledByCaller
	})
	close(l.unblock)
	answeredCanceled(t, sub)
	if n := len(d.sub.Submissions()); n != 0 {
		t.Fatalf("%d submissions ran for a request cancelled before it ran", n)
	}
}

// Without tenants or a client user, the id is a cancel's only proof: a
// request with a guessable one is served, but its cancel is refused and
// counted, like a malformed one, and neither is remembered.
func TestWithoutTenantsOrUsersOnlyAnUnguessableIDCancels(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	d, arrived, gone, release := heldDoor(t, Options{Registerer: reg})
	const id = "job-43"
	inbox := d.nc.NewInbox()
	sub, err := d.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := d.nc.PublishMsg(&nats.Msg{Subject: schemas.SubmitSubject, Reply: inbox,
		Header: nats.Header{schemas.HeaderRequestID: {id}}, Data: submitBody(t, false)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-arrived:
	case <-time.After(natsWait):
		t.Fatal("the request with a short id was not served")
	}
	for _, c := range []struct {
		name, subject, reason string
		count                 float64
	}{
		{"a short id", schemas.SubmitCancelSubjectFor(inbox, id), RejectGuessableID, 1},
		{"an id one short of 128 bits as hex", schemas.SubmitCancelSubject(anonymousID[1:]), RejectGuessableID, 2},
		{"no cancel subject", schemas.SubmitCancelPrefix + "carol.job.43", RejectMalformed, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := d.nc.Publish(c.subject, nil); err != nil {
				t.Fatal(err)
			}
			eventually.True(t, natsWait, "the cancel to be counted "+c.reason, func() bool {
				return rejectedCancels(t, reg, c.reason) == c.count
			})
		})
	}
	d.svc.mu.Lock()
	remembered := d.svc.early.total
	d.svc.mu.Unlock()
	if remembered != 0 {
		t.Fatalf("%d refused cancels remembered, want none", remembered)
	}
	select {
	case <-gone:
		t.Fatal("a refused cancel cancelled the request")
	default:
	}
	close(release)
	m, err := sub.NextMsg(natsWait)
	if err != nil {
		t.Fatal(err)
	}
	answered(t, m)
}

// The memory of early cancels is bounded per owner and in all: an owner's
// flood evicts its own oldest, never another's, and past the total a new
// one is refused until the old ones expire.
func TestOneOwnersFloodOfEarlyCancelsNeverEvictsAnothers(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	e := newEarlyCancels()
	victim := callKey{owner{"acme", "alice"}, "job-1"}
	if !e.remember(victim, now) {
		t.Fatal("the victim's cancel was refused")
	}
	forger := owner{"other", "bob"}
	for i := range cancelMemoryPerOwner + 100 {
		if !e.remember(callKey{forger, "f-" + strconv.Itoa(i)}, now.Add(time.Duration(i)*time.Microsecond)) {
			t.Fatalf("the forger's cancel %d was refused, want its own oldest evicted", i)
		}
	}
	if n := len(e.byOwner[forger]); n != cancelMemoryPerOwner || e.total != cancelMemoryPerOwner+1 {
		t.Fatalf("the forger keeps %d, %d in all; want %d and one more", n, e.total, cancelMemoryPerOwner)
	}
	if e.take(callKey{forger, "f-0"}, now) {
		t.Error("the forger's oldest cancel survived its flood")
	}
	if !e.take(victim, now) {
		t.Fatal("the victim's cancel was evicted by another owner's flood")
	}

	// Many owners fill the total: the next is refused until they expire.
	e = newEarlyCancels()
	for i := 0; e.total < cancelMemoryCap; i++ {
		o := owner{"t", "u" + strconv.Itoa(i/cancelMemoryPerOwner)}
		if !e.remember(callKey{o, strconv.Itoa(i)}, now) {
			t.Fatalf("cancel %d refused below the total", i)
		}
	}
	if e.remember(victim, now) {
		t.Fatal("a cancel was remembered past the total")
	}
	if !e.remember(victim, now.Add(cancelMemory+time.Second)) || e.total != 1 {
		t.Fatalf("after the others expired: %d remembered, want the victim's alone", e.total)
	}
	if e.take(victim, now.Add(2*cancelMemory+2*time.Second)) {
		t.Fatal("an expired cancel was taken")
	}
}
