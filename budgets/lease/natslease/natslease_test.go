package natslease

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hedgerow/hedgerow/budgets/lease"
	"github.com/hedgerow/hedgerow/budgets/lease/leasetest"
	"github.com/hedgerow/hedgerow/internal/natstest"
)

func newJetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(natstest.Connect(t, natstest.Start(t, natstest.JetStream(t.TempDir()))))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func ctxOf(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// Each subtest has a bucket of its own on one server.
func TestABucketIsAnAuthority(t *testing.T) {
	js := newJetStream(t)
	n := 0
	leasetest.Authority(t, func(t *testing.T) lease.Authority {
		n++
		auth, err := New(ctxOf(t, 10*time.Second), js, Options{Bucket: fmt.Sprint("leases_", n)})
		if err != nil {
			t.Fatal(err)
		}
		return auth
	})
}

func TestNewBindsToTheBucketAnotherRegionCreated(t *testing.T) {
	js := newJetStream(t)
	ctx := ctxOf(t, 10*time.Second)
	first, err := New(ctx, js, Options{})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := first.Put(ctx, "tenant:acme:rate", lease.NewTable(time.Unix(0, 0)), 0)
	if err != nil {
		t.Fatal(err)
	}
	second, err := New(ctx, js, Options{Replicas: 1})
	if err != nil {
		t.Fatalf("binding to the existing bucket: %v", err)
	}
	if _, got, err := second.Get(ctx, "tenant:acme:rate"); err != nil || got != rev {
		t.Fatalf("the second authority reads revision %d (%v), want the first's %d", got, err, rev)
	}
	if _, err := js.KeyValue(ctx, DefaultBucket); err != nil {
		t.Fatalf("the default bucket %s: %v", DefaultBucket, err)
	}
}

func TestRefusalsSayWhatIsWrong(t *testing.T) {
	js := newJetStream(t)
	ctx := ctxOf(t, 10*time.Second)
	if _, err := New(ctx, nil, Options{}); err == nil {
		t.Error("New without JetStream succeeded")
	}
	if _, err := New(ctx, js, Options{Replicas: 6}); err == nil {
		t.Error("New with 6 replicas succeeded")
	}
	auth, err := New(ctx, js, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := auth.Get(ctx, ""); !errors.Is(err, lease.ErrInvalid) {
		t.Errorf("get of the empty key: %v, want lease.ErrInvalid", err)
	}
	if _, err := auth.Put(ctx, "", lease.Table{}, 0); !errors.Is(err, lease.ErrInvalid) {
		t.Errorf("put of the empty key: %v, want lease.ErrInvalid", err)
	}
}

func TestAKeyHoldingNoTableIsAnError(t *testing.T) {
	js := newJetStream(t)
	ctx := ctxOf(t, 10*time.Second)
	auth, err := New(ctx, js, Options{})
	if err != nil {
		t.Fatal(err)
	}
	k, _ := kvKey("tenant:acme:rate")
	if _, err := auth.kv.Put(ctx, k, []byte("not json")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := auth.Get(ctx, "tenant:acme:rate"); err == nil {
		t.Fatal("a key holding no table read as a table")
	}
}

// What Put maps to lease.ErrConflict, as JetStream answers it: Create of an
// existing key is ErrKeyExists; Update at a stale revision, or of a key
// with none, is ErrKeyRevisionMismatch (on a one-replica bucket it matches
// ErrKeyExists too, by its error code; on a replicated one it does not).
func TestJetStreamAnswersAStaleRevisionAsPutExpects(t *testing.T) {
	js := newJetStream(t)
	ctx := ctxOf(t, 10*time.Second)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "raw"})
	if err != nil {
		t.Fatal(err)
	}
	first, err := kv.Create(ctx, "k", []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, "k", []byte("2")); !errors.Is(err, jetstream.ErrKeyExists) {
		t.Errorf("create of an existing key: %v, want ErrKeyExists", err)
	}
	if _, err := kv.Update(ctx, "k", []byte("2"), first); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Update(ctx, "k", []byte("3"), first); !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		t.Errorf("update at a stale revision: %v, want ErrKeyRevisionMismatch", err)
	}
	if _, err := kv.Update(ctx, "none", []byte("1"), first); !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		t.Errorf("update of a key with no value: %v, want ErrKeyRevisionMismatch", err)
	}
}
