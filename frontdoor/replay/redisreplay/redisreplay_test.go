package redisreplay_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/frontdoor/replay"
	"github.com/hedgerow/hedgerow/frontdoor/replay/redisreplay"
	"github.com/hedgerow/hedgerow/frontdoor/replay/replaytest"
	"github.com/hedgerow/hedgerow/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// factory makes stores on client, each under a prefix of its own so the
// suite's stores share one server without sharing keys.
func factory(client redis.UniversalClient) replaytest.Factory {
	var n atomic.Int64
	return func(t *testing.T, clock *replaytest.Clock, maxEntry int) replay.Store {
		s, err := redisreplay.New(client, redisreplay.Options{Prefix: "t" + strconv.FormatInt(n.Add(1), 10),
			MaxEntryBytes: maxEntry, MarkerKeep: replaytest.MarkerKeep, Timeout: 5 * time.Second, Now: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
}

func TestStoreConformsOnStandaloneRedis(t *testing.T) {
	replaytest.Run(t, factory(redistest.Start(t).Client()))
}

func TestStoreConformsOnRedisCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { _ = client.Close() })
	replaytest.Run(t, factory(client))
}

// Redis collects an answer by its own TTL too, and every key is one hash
// slot under the prefix.
func TestAnswerKeyCarriesTheTTLAndOneHashSlot(t *testing.T) {
	client := redistest.Start(t).Client()
	s, err := redisreplay.New(client, redisreplay.Options{Prefix: "hr"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Put(ctx, "abc", &replay.Answer{Status: 200, Body: []byte("x")}, time.Minute); err != nil {
		t.Fatal(err)
	}
	ttl, err := client.PTTL(ctx, "hr:{rp:abc}").Result()
	if err != nil || ttl <= 0 || ttl > time.Minute {
		t.Fatalf("PTTL = %v, %v; want within a minute", ttl, err)
	}
}

// A store that cannot reach Redis fails its calls; the door then serves
// without replay and the winner gate guards the user action.
func TestUnreachableRedisIsAnError(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	s, err := redisreplay.New(client, redisreplay.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	if _, err := s.Get(context.Background(), "k"); err == nil {
		t.Fatal("Get on a dead Redis succeeded")
	}
	if err := s.Put(context.Background(), "k", &replay.Answer{Status: 200}, time.Minute); err == nil {
		t.Fatal("Put on a dead Redis succeeded")
	}
}
