package peers

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/internal/node"
	"github.com/hedgerow/hedgerow/internal/tools/loadgen"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
)

// groupTap collects hedgerow's group records (docs/architecture.md §9) by
// prompt fingerprint, so each of hedgerow's slow requests can be told by
// what its dispatcher decided: hedged or not, why not, at which delay.
type groupTap struct {
	nc  *nats.Conn
	mu  sync.Mutex
	by  map[string]schemas.GroupRecord
	bad int
}

func tapGroupRecords(s *node.Serve) (*groupTap, error) {
	nc, err := s.Observe("peers-group-records")
	if err != nil {
		return nil, fmt.Errorf("tap group records: %w", err)
	}
	t := &groupTap{nc: nc, by: map[string]schemas.GroupRecord{}}
	if _, err := nc.Subscribe(schemas.GroupRecordSubject, t.add); err != nil {
		nc.Close()
		return nil, fmt.Errorf("tap group records: %w", err)
	}
	if err := nc.Flush(); err != nil {
		nc.Close()
		return nil, fmt.Errorf("tap group records: %w", err)
	}
	return t, nil
}

func (t *groupTap) add(m *nats.Msg) {
	var r schemas.GroupRecord
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := json.Unmarshal(m.Data, &r); err != nil {
		t.bad++
		return
	}
	t.by[r.PromptFingerprint] = r
}

// wait returns, once every fingerprint of want has a record or timeout
// passed, the records of want's requests and how many are missing.
func (t *groupTap) wait(ctx context.Context, want []string, timeout time.Duration) (map[string]schemas.GroupRecord, int, error) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	limit := time.NewTimer(timeout)
	defer limit.Stop()
	for {
		t.mu.Lock()
		missing := 0
		for _, fp := range want {
			if _, ok := t.by[fp]; !ok {
				missing++
			}
		}
		bad := t.bad
		t.mu.Unlock()
		if bad > 0 {
			return nil, 0, fmt.Errorf("tap group records: %d undecodable records", bad)
		}
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		default:
		}
		if missing == 0 {
			break
		}
		select {
		case <-tick.C:
			continue
		case <-limit.C:
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
		break
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]schemas.GroupRecord, len(want))
	for _, fp := range want {
		if r, ok := t.by[fp]; ok {
			out[fp] = r
		}
	}
	return out, len(want) - len(out), nil
}

// reset forgets the records seen so far (the warm-up's).
func (t *groupTap) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.by)
}

func (t *groupTap) close() { t.nc.Close() }

// attemptTrace is one upstream request of a caller request as the fake saw
// it; times are real milliseconds from when the caller request was due.
type attemptTrace struct {
	Route   int
	StartMs float64
	// DrawnFirstMs is the first token the workload drew for it (ok
	// outcomes), from the attempt's start, whether or not it was sent.
	DrawnFirstMs float64
	Drawn        bool
	// FirstMs is when its first token went out, from due; sent says it did.
	FirstMs float64
	Sent    bool
	EndMs   float64
	Outcome string
	End     string
	Stalled bool
}

// requestTrace is one caller request's path: what the client measured, the
// fakes' records of it, and for hedgerow its group record.
type requestTrace struct {
	Index    int
	TTFT     time.Duration
	Total    time.Duration
	Failed   bool
	Attempts []attemptTrace
	Group    *schemas.GroupRecord
}

// upstreamFirst is the earliest first token any fake sent for the
// request, from due: the time to first token with no client, dispatcher or
// wire in between.
func (r requestTrace) upstreamFirst() (time.Duration, bool) {
	best, ok := math.Inf(1), false
	for _, a := range r.Attempts {
		if a.Sent && a.FirstMs < best {
			best, ok = a.FirstMs, true
		}
	}
	return millis(best), ok
}

// upstreamEnd is when the earliest attempt that completed its answer ended
// at its fake, from due.
func (r requestTrace) upstreamEnd() (time.Duration, bool) {
	best, ok := math.Inf(1), false
	for _, a := range r.Attempts {
		if a.Sent && a.End == string(fakellm.EndCompleted) && a.EndMs < best {
			best, ok = a.EndMs, true
		}
	}
	return millis(best), ok
}

// second is the request's second upstream attempt, if any.
func (r requestTrace) second() (attemptTrace, bool) {
	if len(r.Attempts) < 2 {
		return attemptTrace{}, false
	}
	return r.Attempts[1], true
}

// secondIsHedge says the second attempt started while the first was still
// open (a hedge, not a replacement after the first ended).
func (r requestTrace) secondIsHedge() bool {
	s, ok := r.second()
	return ok && r.Attempts[0].EndMs > s.StartMs
}

func traces(reqs []request, sum *loadgen.Summary, upstream [][]fakellm.Record, groups map[string]schemas.GroupRecord, deadline time.Duration) []requestTrace {
	start := float64(sum.Start.UnixNano()) / 1e6
	out := make([]requestTrace, len(reqs))
	for i, res := range sum.Results {
		due := start + float64(res.Due)/float64(time.Millisecond)
		t := requestTrace{Index: i, TTFT: res.FirstToken, Total: res.Total}
		if res.Err != nil || res.FirstToken <= 0 {
			t.TTFT, t.Failed = deadline, true
		}
		recs := slices.Clone(upstream[i])
		slices.SortFunc(recs, func(a, b fakellm.Record) int { return int(a.StartUnixMs - b.StartUnixMs) })
		for _, r := range recs {
			a := attemptTrace{Route: r.Route, StartMs: float64(r.StartUnixMs) - due, EndMs: float64(r.EndUnixMs) - due,
				Outcome: r.Outcome, End: string(r.End), Stalled: r.Stalled}
			if r.FirstByteRealMs != nil {
				a.FirstMs, a.Sent = a.StartMs+*r.FirstByteRealMs, true
			}
			if r.FirstByteModelMs != nil {
				a.DrawnFirstMs, a.Drawn = *r.FirstByteModelMs, true
			}
			t.Attempts = append(t.Attempts, a)
		}
		if g, ok := groups[reqs[i].fingerprint]; ok {
			t.Group = &g
		}
		out[i] = t
	}
	return out
}

// tailReport is one contender's tail, taken apart.
type tailReport struct {
	Name string
	// Hedged counts requests whose second attempt started while the first
	// was open; Replaced those whose second came after the first ended.
	Hedged, Replaced int
	// HedgeAt is when hedges started, from due (P10, P50, P90).
	HedgeAt [3]time.Duration
	// Overhead is the client's time to first token minus the earliest
	// first token a fake sent (P50, P99, P99.9, over answered requests).
	Overhead [3]time.Duration
	// EndOverhead is the client's time to the end of the stream minus
	// when the fake that completed it finished writing (P50, P99, P99.9).
	EndOverhead [3]time.Duration
	// PrimaryFirstP95 is the P95 of the first token the workload drew for
	// each request's first attempt (ok draws, sent or not, real time): the
	// delay a perfect P95 estimator would arm, with no wire in between.
	PrimaryFirstP95 time.Duration
	// PrimarySentP95 is the same P95 over when the fake actually sent that
	// first token from the attempt's start, a primary cancelled before it
	// counting as slower than every sent one.
	PrimarySentP95 time.Duration
	// Wire is, for hedgerow's groups its primary won, the group record's
	// first byte (as the dispatcher measured it from the group's start)
	// minus when the fake sent that first token (from due), P50/P95/P99:
	// what the estimator's samples carry beyond the provider's latency.
	Wire [3]time.Duration
	// Slowest are the slowest 1% by time to first token, slowest first.
	Slowest []requestTrace
	// Classes counts Slowest by what made them slow (classify).
	Classes map[string]int
	// Suppressed counts hedgerow's group records by hedge suppression
	// reason and guardrail decision, over all its requests.
	Suppressed map[string]int
	// NoRecord counts hedgerow requests whose group record never came.
	NoRecord int
}

func tails(reqs []request, tr []requestTrace, timeScale float64) []tailReport {
	out := make([]tailReport, len(contenderNames))
	by := make([][]requestTrace, len(contenderNames))
	for i, t := range tr {
		by[reqs[i].contender] = append(by[reqs[i].contender], t)
	}
	for k, ts := range by {
		rep := tailReport{Name: contenderNames[k], Classes: map[string]int{}, Suppressed: map[string]int{}}
		var hedgeAt, overhead, endOverhead, primaryFirst, primarySent, wire []time.Duration
		for _, t := range ts {
			if len(t.Attempts) > 0 && t.Attempts[0].Drawn {
				a := t.Attempts[0]
				sent := time.Duration(math.MaxInt64)
				if a.Sent {
					sent = millis(a.FirstMs - a.StartMs)
				}
				primarySent = append(primarySent, sent)
				primaryFirst = append(primaryFirst, millis(a.DrawnFirstMs*timeScale))
			}
			if g := t.Group; g != nil && g.WinnerRole == schemas.RolePrimary && g.FirstByteMs != nil && len(t.Attempts) > 0 && t.Attempts[0].Sent {
				wire = append(wire, time.Duration(*g.FirstByteMs)*time.Millisecond-millis(t.Attempts[0].FirstMs))
			}
			switch {
			case t.secondIsHedge():
				rep.Hedged++
				s, _ := t.second()
				hedgeAt = append(hedgeAt, millis(s.StartMs))
			case len(t.Attempts) >= 2:
				rep.Replaced++
			}
			if f, ok := t.upstreamFirst(); ok && !t.Failed {
				overhead = append(overhead, t.TTFT-f)
				if e, ok := t.upstreamEnd(); ok {
					endOverhead = append(endOverhead, t.Total-e)
				}
			}
			if k == hedgerowAt {
				if t.Group == nil {
					rep.NoRecord++
				} else {
					rep.Suppressed[groupDecision(*t.Group)]++
				}
			}
		}
		rep.PrimaryFirstP95 = quantiles(primaryFirst, 0.95)[0]
		rep.PrimarySentP95 = quantiles(primarySent, 0.95)[0]
		rep.Wire = [3]time.Duration(quantiles(wire, 0.5, 0.95, 0.99))
		rep.HedgeAt = [3]time.Duration(quantiles(hedgeAt, 0.1, 0.5, 0.9))
		rep.Overhead = [3]time.Duration(quantiles(overhead, 0.5, 0.99, 0.999))
		rep.EndOverhead = [3]time.Duration(quantiles(endOverhead, 0.5, 0.99, 0.999))
		sorted := slices.Clone(ts)
		slices.SortStableFunc(sorted, func(a, b requestTrace) int { return int(b.TTFT - a.TTFT) })
		rep.Slowest = sorted[:min(len(sorted), (len(sorted)+99)/100)]
		for _, t := range rep.Slowest {
			class := classify(t)
			if t.Group != nil && len(t.Attempts) == 1 {
				class += " (" + groupDecision(*t.Group) + ")"
			}
			rep.Classes[class]++
		}
		out[k] = rep
	}
	return out
}

func millis(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// groupDecision names what a group record says of its hedge.
func groupDecision(g schemas.GroupRecord) string {
	switch {
	case g.HedgeLaunched:
		return "hedge launched"
	case g.HedgeSuppressedReason != "":
		return "suppressed " + g.HedgeSuppressedReason
	case g.GuardrailDecision != schemas.GuardrailAllow:
		return "guardrail " + string(g.GuardrailDecision)
	}
	return "no hedge needed"
}

// classify says what made one slow request slow, from the fakes' side:
//   - "failed": no first token reached the client;
//   - "one attempt, stalled": nothing but a slow primary (never hedged);
//   - "hedged, both slow": a hedge went out and also came late;
//   - "replaced after an error": the first attempt failed, another answered;
//   - "overhead": a fake sent its first token in under half the client's
//     time to first token — the time went between the fake and the client.
func classify(t requestTrace) string {
	switch f, ok := t.upstreamFirst(); {
	case t.Failed:
		return "failed"
	case ok && f < t.TTFT/2:
		return "overhead"
	}
	switch {
	case len(t.Attempts) == 1:
		return "one attempt, stalled"
	case t.secondIsHedge():
		return "hedged, both slow"
	}
	return "replaced after an error"
}

// writeTails prints each contender's tail taken apart, and hedgerow's
// slowest 0.1% request by request.
func writeTails(w io.Writer, tr []tailReport, perContender int) {
	fmt.Fprintf(w, "tails (times real ms from due): hedged / replaced requests; hedge start P10/P50/P90; "+
		"client TTFT minus the fakes' first token P50/P99/P99.9, the same at the stream's end; P95 of the primaries' drawn first token; the slowest 1%% by cause\n")
	for _, t := range tr {
		classes := slices.Sorted(maps.Keys(t.Classes))
		parts := make([]string, len(classes))
		for i, c := range classes {
			parts[i] = fmt.Sprintf("%s %d", c, t.Classes[c])
		}
		fmt.Fprintf(w, "  %-11s hedged %d, replaced %d; hedge at %s/%s/%s; overhead %s/%s/%s, at the end %s/%s/%s; primary first P95 drawn %s sent %s; slowest %d: %s\n",
			t.Name, t.Hedged, t.Replaced, msd(t.HedgeAt[0]), msd(t.HedgeAt[1]), msd(t.HedgeAt[2]),
			msd(t.Overhead[0]), msd(t.Overhead[1]), msd(t.Overhead[2]), msd(t.EndOverhead[0]), msd(t.EndOverhead[1]), msd(t.EndOverhead[2]), msd(t.PrimaryFirstP95), msd(t.PrimarySentP95), len(t.Slowest), strings.Join(parts, ", "))
		if len(t.Suppressed) > 0 {
			ds := slices.Sorted(maps.Keys(t.Suppressed))
			sp := make([]string, len(ds))
			for i, d := range ds {
				sp[i] = fmt.Sprintf("%s %d", d, t.Suppressed[d])
			}
			fmt.Fprintf(w, "  %-11s group records: %s; %d without a record; dispatcher's first byte minus the fake's P50/P95/P99 %s/%s/%s\n",
				"", strings.Join(sp, ", "), t.NoRecord, msd(t.Wire[0]), msd(t.Wire[1]), msd(t.Wire[2]))
		}
	}
	n := (perContender + 999) / 1000
	for _, t := range tr {
		fmt.Fprintf(w, "%s's slowest %d:\n", t.Name, n)
		for _, r := range t.Slowest[:min(n, len(t.Slowest))] {
			fmt.Fprintf(w, "  TTFT %s%s:", msd(r.TTFT), map[bool]string{true: " (failed)"}[r.Failed])
			for _, a := range r.Attempts {
				drawn := "-"
				if a.Drawn {
					drawn = fmt.Sprintf("%.0f", a.DrawnFirstMs)
				}
				first := "none"
				if a.Sent {
					first = fmt.Sprintf("%.0f", a.FirstMs)
				}
				fmt.Fprintf(w, " [route %d at %.0f, %s%s, drawn first %s model ms, first sent %s, %s at %.0f]",
					a.Route, a.StartMs, a.Outcome, map[bool]string{true: " stalled"}[a.Stalled], drawn, first, a.End, a.EndMs)
			}
			if g := r.Group; g != nil {
				delay := "none"
				if g.HedgeDelayMs != nil {
					delay = fmt.Sprint(*g.HedgeDelayMs)
				}
				fmt.Fprintf(w, " group: %s, delay %s ms, guardrail %s, winner %s", groupDecision(*g), delay, g.GuardrailDecision, g.WinnerRole)
			}
			fmt.Fprintln(w)
		}
	}
}

func msd(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d)/float64(time.Millisecond)) }
