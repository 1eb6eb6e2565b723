package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/hedgerow/hedgerow/simulator/fakellm"
)

// statsPageLimit is how many records one /stats poll asks for.
const statsPageLimit = 10_000

// quietPoll is how often the fakes are asked whether they still hold
// requests once a run's groups have all ended.
const quietPoll = 5 * time.Millisecond

// upstream reads the fake routes' /stats: the provider's own account of
// every attempt that reached it — when the client disconnected and what
// was billed — which no hedgerow component reports about itself.
type upstream struct {
	client *http.Client
	bases  []string
	since  []uint64 // per route, the last record fetched
}

func newUpstream(bases []string) *upstream {
	return &upstream{client: &http.Client{Timeout: 10 * time.Second}, bases: bases, since: make([]uint64, len(bases))}
}

// collect waits, for at most timeout, until no fake holds a request, then
// returns every record finished since the last collect, by route.
func (u *upstream) collect(ctx context.Context, timeout time.Duration) ([][]fakellm.Record, error) {
	if err := u.waitQuiet(ctx, timeout); err != nil {
		return nil, err
	}
	out := make([][]fakellm.Record, len(u.bases))
	for r := range u.bases {
		for {
			st, err := u.stats(ctx, r, u.since[r], statsPageLimit)
			if err != nil {
				return nil, err
			}
			if st.Dropped > 0 {
				return nil, fmt.Errorf("fake route %d dropped %d records before they were read", r, st.Dropped)
			}
			out[r] = append(out[r], st.Requests...)
			u.since[r] = st.NextSince
			if !st.More {
				break
			}
		}
	}
	return out, nil
}

func (u *upstream) waitQuiet(ctx context.Context, timeout time.Duration) error {
	tick := time.NewTicker(quietPoll)
	defer tick.Stop()
	limit := time.NewTimer(timeout)
	defer limit.Stop()
	for {
		busy := int64(0)
		for r := range u.bases {
			// One record at most: the poll is for the totals.
			st, err := u.stats(ctx, r, u.since[r], 1)
			if err != nil {
				return err
			}
			busy += st.Totals.InFlight
		}
		if busy == 0 {
			return nil
		}
		select {
		case <-tick.C:
		case <-limit.C:
			return fmt.Errorf("fake routes still hold %d requests %v after the run", busy, timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (u *upstream) stats(ctx context.Context, route int, since uint64, limit int) (*fakellm.Stats, error) {
	q := url.Values{"since": {strconv.FormatUint(since, 10)}, "limit": {strconv.Itoa(limit)}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.bases[route]+"/stats?"+q.Encode(), nil)
	if err != nil {
		return nil, fmt.Errorf("fake route %d stats: %w", route, err)
	}
	resp, err := u.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fake route %d stats: %w", route, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fake route %d stats: HTTP %d", route, resp.StatusCode)
	}
	var st fakellm.Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return nil, fmt.Errorf("fake route %d stats: %w", route, err)
	}
	return &st, nil
}

func (u *upstream) close() { u.client.CloseIdleConnections() }
