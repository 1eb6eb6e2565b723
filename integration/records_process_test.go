package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/records"
	"github.com/hedgerow/hedgerow/schemas"
)

// TestEveryAnsweredGroupIsInTheRecordsStreamAfterAGatewayIsKilled runs two
// gateway processes under load, kills one with SIGKILL mid-load, then kills
// and restarts the nats-server process on its JetStream store: every group
// either gateway answered with a 200 has its record in the records stream
// (docs/architecture.md §9: a committed group's record is kept before its
// answer leaves).
func TestEveryAnsweredGroupIsInTheRecordsStreamAfterAGatewayIsKilled(t *testing.T) {
	rp := startReplicaProcesses(t, "records", 20*time.Millisecond)
	const perGateway, senders, killAfter = 150, 8, 40

	var mu sync.Mutex
	answered := map[string]string{} // group → the key it answered
	killedAnswered := 0             // answers of the gateway that is killed
	kill := make(chan struct{})
	var killOnce sync.Once
	var wg sync.WaitGroup
	for gi, gw := range rp.gateways {
		work := make(chan string)
		for range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for key := range work {
					resp, _, err := rp.send(gw, key)
					if err != nil || resp.StatusCode != http.StatusOK {
						continue // the killed gateway's requests in flight, and any after
					}
					gv, err := arbiter.ParseGateValue(resp.Header.Get(frontdoor.HeaderGate))
					if err != nil {
						t.Errorf("%s answered 200 with gate %q: %v", key, resp.Header.Get(frontdoor.HeaderGate), err)
						continue
					}
					mu.Lock()
					answered[gv.Group] = key
					if gi == 0 {
						killedAnswered++
						if killedAnswered == killAfter {
							killOnce.Do(func() { close(kill) })
						}
					}
					mu.Unlock()
				}
			}()
		}
		go func() {
			defer close(work)
			for i := range perGateway {
				work <- fmt.Sprintf("rec-%d-%d", gi, i)
			}
		}()
	}
	select {
	case <-kill:
	case <-time.After(60 * time.Second):
		t.Fatal("the first gateway never answered enough to be killed mid-load")
	}
	rp.procs[0].kill(t) // SIGKILL, with requests in flight
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if killedAnswered >= perGateway {
		t.Fatalf("the killed gateway answered all %d requests: it was not killed mid-load", perGateway)
	}

	// The stream outlives its server's SIGKILL too: restart nats-server on
	// the same store and read every answered group there.
	nc := rp.restartNATS()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var st jetstream.Stream
	eventually.True(t, 30*time.Second, "the records stream after the restart", func() bool {
		st, err = js.Stream(ctx, records.DefaultStream)
		return err == nil
	})
	missing := 0
	for group, key := range answered {
		m, err := st.GetLastMsgForSubject(ctx, schemas.StoredGroupSubject(group))
		if err != nil {
			missing++
			t.Errorf("answered group %s (%s) has no record in the stream: %v", group, key, err)
			continue
		}
		var r schemas.GroupRecord
		if err := json.Unmarshal(m.Data, &r); err != nil || r.HedgeGroupID != group || r.Outcome != schemas.GroupCommitted {
			t.Errorf("group %s: record %s (%v)", group, m.Data, err)
		}
	}
	t.Logf("%d groups answered (%d by the killed gateway before its SIGKILL), %d missing from the stream",
		len(answered), killedAnswered, missing)
}
