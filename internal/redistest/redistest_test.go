package redistest

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestServerAnswersAndForgetsEverythingOnRestart(t *testing.T) {
	s := Start(t)
	c := s.Client()
	if err := c.Set(t.Context(), "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET on %s: %v", s.Addr(), err)
	}
	s.Kill()
	if err := c.Ping(t.Context()).Err(); err == nil {
		t.Fatal("PING answered by a killed server")
	}
	s.Restart()
	if n, err := c.Exists(t.Context(), "k").Result(); err != nil || n != 0 {
		t.Fatalf("after restart EXISTS k = %d, %v; want 0, nil", n, err)
	}
}

func TestClusterServesEverySlot(t *testing.T) {
	cl := StartCluster(t)
	c := cl.Client()
	// Keys in different hash tags land on different masters.
	for _, key := range []string{"{a}k", "{b}k", "{c}k", "{d}k", "{e}k"} {
		if err := c.Set(t.Context(), key, "v", 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
	}
	var masters atomic.Int32
	err := c.ForEachMaster(t.Context(), func(ctx context.Context, m *redis.Client) error {
		masters.Add(1)
		return nil
	})
	if err != nil || masters.Load() != 3 {
		t.Fatalf("masters = %d, %v; want 3", masters.Load(), err)
	}
}
