package redisreplay_test

import (
	"context"
	"errors"
	"fmt"
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
	return func(t *testing.T, clock *replaytest.Clock, maxEntry, maxTotal int) replay.Store {
		s, err := redisreplay.New(client, redisreplay.Options{Prefix: "t" + strconv.FormatInt(n.Add(1), 10),
			MaxEntryBytes: maxEntry, MaxTotalBytes: maxTotal, MarkerKeep: replaytest.MarkerKeep, Timeout: 5 * time.Second, Now: clock.Now})
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

// failSets fails every pipeline holding a SET (the answer's, with the
// marker's DEL) while on, before it reaches Redis.
type failSets struct{ on atomic.Bool }

func (f *failSets) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *failSets) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (f *failSets) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if f.on.Load() && c.Name() == "set" {
				return errors.New("SET failed on purpose")
			}
		}
		return next(ctx, cmds)
	}
}

// A Put whose SET fails after its bytes were counted gives them back: a
// store that failed many times still keeps answers up to its bound
// afterwards, instead of counting bytes it never stored until their
// bucket lapses.
func TestAPutWhoseSetFailsGivesItsCountedBytesBack(t *testing.T) {
	client := redistest.Start(t).Client()
	hook := &failSets{}
	client.AddHook(hook)
	const maxTotal = 8 << 10
	s, err := redisreplay.New(client, redisreplay.Options{MaxTotalBytes: maxTotal})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	put := func(key string) error {
		return s.Put(ctx, key, &replay.Answer{Fingerprint: "fp", Status: 200, Body: make([]byte, 1000)}, time.Hour)
	}
	hook.on.Store(true)
	for i := range 20 {
		if err := put("failed" + strconv.Itoa(i)); err == nil || errors.Is(err, replay.ErrStoreFull) {
			t.Fatalf("Put while its SET fails = %v; want the SET's error", err)
		}
	}
	hook.on.Store(false)
	kept := 0
	for i := range 20 {
		if err := put("kept" + strconv.Itoa(i)); err == nil {
			kept++
		} else if !errors.Is(err, replay.ErrStoreFull) {
			t.Fatal(err)
		}
	}
	if kept < 4 {
		t.Fatalf("%d answers of 1000 bytes kept under a bound of %d after 20 failed SETs; want the bound's room back", kept, maxTotal)
	}
}

// The byte count is one hash of its own (its own hash slot, apart from the
// answers'), a field per bucket of a twenty-fourth of the TTL holding the
// bytes counted and when the last answer it counts expires, and Redis
// collects it no later than that.
func TestTheByteCountIsAHashOfItsOwnThatLapsesWithItsLastAnswer(t *testing.T) {
	client := redistest.Start(t).Client()
	clock := replaytest.NewClock()
	s, err := redisreplay.New(client, redisreplay.Options{Prefix: "hr", Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const ttl = 24 * time.Minute // buckets of a minute
	for range 2 {
		if err := s.Put(ctx, "abc", &replay.Answer{Status: 200, Body: []byte("x")}, ttl); err != nil {
			t.Fatal(err)
		}
	}
	fields, err := client.HGetAll(ctx, "hr:{rp}:bytes").Result()
	if err != nil || len(fields) != 1 {
		t.Fatalf("HGETALL = %v, %v; want one bucket", fields, err)
	}
	start := clock.Now().UnixMilli() / time.Minute.Milliseconds() * time.Minute.Milliseconds()
	stored, err := client.Get(ctx, "hr:{rp:abc}").Result()
	if err != nil {
		t.Fatal(err)
	}
	// Counted twice (a replaced answer is, until its bucket lapses).
	want := fmt.Sprintf("%d %d", 2*(len(stored)+len("hr:{rp:abc}")+128), start+time.Minute.Milliseconds()+ttl.Milliseconds())
	if got := fields[strconv.FormatInt(start, 10)]; got != want {
		t.Fatalf("bucket %d = %q; want %q (bytes, expiry in Unix ms)", start, got, want)
	}
	if pttl, err := client.PTTL(ctx, "hr:{rp}:bytes").Result(); err != nil || pttl <= 0 || pttl > ttl+time.Minute {
		t.Fatalf("PTTL = %v, %v; want within the TTL and a bucket", pttl, err)
	}
}
