package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/hedgerow/hedgerow/internal/node"
)

// Why a probe gave no sample.
var (
	errNoRace   = errors.New("no race at the provider")
	errNotSeen  = errors.New("the provider did not see the request before its cancel")
	errTooEarly = errors.New("disconnect before the winner's first token")
)

// raceSample is the cancel latency one hedged probe left at the race
// route, which both its attempts reached: from the winner's first byte
// written (its first token) to the moment the provider saw the loser's
// client go. A probe whose primary won before the hedge launched, or
// whose attempts did not race, leaves no sample (errNoRace).
func raceSample(ts []node.FakeTiming) (time.Duration, error) {
	var winner, loser *node.FakeTiming
	for i := range ts {
		switch t := &ts[i]; {
		case t.FirstWriteUs != 0 && t.GoneUs == 0 && winner == nil:
			winner = t
		case t.FirstWriteUs == 0 && t.GoneUs != 0 && loser == nil:
			loser = t
		default:
			return 0, fmt.Errorf("%w: %s", errNoRace, describe(ts))
		}
	}
	if winner == nil || loser == nil || len(ts) != 2 {
		return 0, fmt.Errorf("%w: %s", errNoRace, describe(ts))
	}
	if loser.GoneUs < winner.FirstWriteUs {
		return 0, fmt.Errorf("%w: %s", errTooEarly, describe(ts))
	}
	return time.Duration(loser.GoneUs-winner.FirstWriteUs) * time.Microsecond, nil
}

// directSample is a direct client's disconnect as the provider saw it:
// from the client's cancel (unix µs) to the provider seeing it go. The
// request must have arrived before the cancel, and its client gone.
func directSample(ts []node.FakeTiming, cancelledUs int64) (time.Duration, error) {
	if len(ts) != 1 || ts[0].GoneUs == 0 || ts[0].ArrivedUs > cancelledUs {
		return 0, fmt.Errorf("%w: cancelled at %d µs; %s", errNotSeen, cancelledUs, describe(ts))
	}
	return time.Duration(max(ts[0].GoneUs-cancelledUs, 0)) * time.Microsecond, nil
}

// describe lists timings' moments in ms from the first arrival, for a
// probe that left no sample: "2 requests: [arrived 0.000, first write
// 50.112, end 50.130] [arrived 10.210, gone 51.002, end 51.010]".
func describe(ts []node.FakeTiming) string {
	if len(ts) == 0 {
		return "no request reached the provider"
	}
	origin := ts[0].ArrivedUs
	for _, t := range ts {
		origin = min(origin, t.ArrivedUs)
	}
	at := func(us int64) string { return strconv.FormatFloat(float64(us-origin)/1000, 'f', 3, 64) }
	var b strings.Builder
	fmt.Fprintf(&b, "%d requests:", len(ts))
	for _, t := range ts {
		fmt.Fprintf(&b, " [arrived %s", at(t.ArrivedUs))
		if t.FirstWriteUs != 0 {
			fmt.Fprintf(&b, ", first write %s", at(t.FirstWriteUs))
		}
		if t.GoneUs != 0 {
			fmt.Fprintf(&b, ", gone %s", at(t.GoneUs))
		}
		fmt.Fprintf(&b, ", end %s]", at(t.EndedUs))
	}
	return b.String()
}

// timingsReader follows a fake's GET /timings.
type timingsReader struct {
	base   string
	client *http.Client
	since  uint64
}

// fetch returns the timings kept since the last fetch.
func (r *timingsReader) fetch(ctx context.Context) ([]node.FakeTiming, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.base+node.FakeTimingsPath+"?since="+strconv.FormatUint(r.since, 10), nil)
	if err != nil {
		return nil, fmt.Errorf("timings: %w", err)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("timings: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("timings: %d %s: %v", resp.StatusCode, bytes.TrimSpace(body), err)
	}
	var out node.FakeTimings
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("timings: %w", err)
	}
	if out.Dropped > 0 {
		return nil, fmt.Errorf("timings: %d dropped between fetches", out.Dropped)
	}
	r.since = out.NextSince
	return out.Timings, nil
}

// await fetches until n timings have come (a request is kept once its
// handler returns, a loser's once its disconnect was seen), or within
// bounds any that came.
func (r *timingsReader) await(ctx context.Context, n int, within time.Duration) ([]node.FakeTiming, error) {
	deadline := time.Now().Add(within)
	var got []node.FakeTiming
	for {
		ts, err := r.fetch(ctx)
		if err != nil {
			return got, err
		}
		got = append(got, ts...)
		if len(got) >= n || time.Now().After(deadline) {
			return got, nil
		}
		select {
		case <-ctx.Done():
			return got, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}
