package fakellm

import (
	"errors"
	"fmt"
	"maps"
	"sync"
)

// EndReason says how the exchange of one chat request ended.
type EndReason string

// The end reasons a Record carries.
const (
	// EndCompleted: the server sent its whole answer (a completion, or the
	// 5xx or 429 the workload drew) while the client was still there.
	EndCompleted EndReason = "completed"
	// EndDisconnected: the client went away first; the provider bills what
	// it generated until the cancellation lag ran out.
	EndDisconnected EndReason = "disconnected"
	// EndHangCapped: a hung attempt reached the hang cap and was answered
	// 504 so a client without a deadline cannot hold a connection forever.
	EndHangCapped EndReason = "hang_capped"
	// EndShutdown: Server.Close ended the exchange; it is billed as a
	// disconnect at that moment.
	EndShutdown EndReason = "shutdown"
	// EndBroken: the route broke the stream after Options.BreakAfter
	// tokens, as Record.Break says; the provider bills the tokens sent.
	EndBroken EndReason = "broken"
)

// Record is what /stats reports about one chat request that reached the
// provider. It holds no prompt or output text. Wall-clock times are unix
// milliseconds; "model" times are elapsed model time of the workload draw.
type Record struct {
	// Seq numbers records in the order they finished, from 1; pass the last
	// one seen as ?since= to fetch only newer records.
	Seq       uint64 `json:"seq"`
	RequestID uint64 `json:"request_id"`
	// Attempt is the server's attempt counter, which keys the latency draw.
	Attempt int `json:"attempt"`
	Route   int `json:"route"`

	StartUnixMs int64 `json:"start_unix_ms"`
	EndUnixMs   int64 `json:"end_unix_ms"`
	// ModelStartMs is the attempt's start in model time since the server
	// began: what decided degradation and rate limiting.
	ModelStartMs float64 `json:"model_start_ms"`

	// Outcome is the drawn outcome (workload.Outcome names: ok,
	// server_error, rate_limited, hang).
	Outcome  string `json:"outcome"`
	Degraded bool   `json:"degraded"`
	Stalled  bool   `json:"stalled"`
	Stream   bool   `json:"stream"`
	// Status is the HTTP status sent; 0 when the client left before any.
	Status int `json:"status"`

	// FirstByteModelMs is the drawn time to first byte, for an ok outcome.
	FirstByteModelMs *float64 `json:"first_byte_model_ms,omitempty"`
	// FirstByteRealMs is the measured real time from the request's arrival
	// to the first byte of the answer written, when one was: a completion's
	// body, or a stream's first token (what opened the stream before it, as
	// with Options.OpenEarly, is not the answer).
	FirstByteRealMs *float64 `json:"first_byte_real_ms,omitempty"`

	End EndReason `json:"end"`
	// DisconnectUnixMs and DisconnectModelMs are set for a disconnect or
	// shutdown: when it was seen, and how far into the attempt (model time,
	// less any stall the stream resumed from) it came, which is what
	// billing counts from.
	DisconnectUnixMs  *int64   `json:"disconnect_unix_ms,omitempty"`
	DisconnectModelMs *float64 `json:"disconnect_model_ms,omitempty"`

	// OutputTokens is the answer's full length after the max_tokens cap
	// (a continuation's: the rest of the full text it answers).
	OutputTokens int `json:"output_tokens"`
	TokensSent   int `json:"tokens_sent"`
	// FinishReason is the chat API's (stop or length) in either API, so
	// records of both compare; a Messages answer said end_turn or max_tokens.
	FinishReason string `json:"finish_reason,omitempty"`

	BilledInputTokens  int64 `json:"billed_input_tokens"`
	BilledOutputTokens int64 `json:"billed_output_tokens"`

	// Break is the mode of a stream the route broke (End is then broken),
	// stall for a stream whose stall resumed (Options.BreakStallFor;
	// End is then completed, or disconnected if the client left later), or
	// truncate for an answer the route cut short (End is then completed,
	// FinishReason length, TokensSent and the billed output the tokens
	// sent, OutputTokens the length it would have had).
	Break BreakMode `json:"break,omitempty"`
	// Continuation is the style of a continuation request, and
	// PartialTokens how many tokens of the full answer its partial
	// touched (one it ended inside counts); OutputTokens is the rest.
	Continuation  Continuation `json:"continuation,omitempty"`
	PartialTokens int          `json:"partial_tokens,omitempty"`
}

// Totals count every request since the server started, including records
// the ring has since dropped.
type Totals struct {
	// Requests counts chat requests that reached the provider, in flight
	// included.
	Requests int64 `json:"requests"`
	InFlight int64 `json:"in_flight"`
	// Invalid counts chat requests answered 4xx before reaching the
	// provider (bad JSON, no messages).
	Invalid int64 `json:"invalid"`
	// ByOutcome and ByEnd count finished requests.
	ByOutcome          map[string]int64    `json:"by_outcome"`
	ByEnd              map[EndReason]int64 `json:"by_end"`
	TokensSent         int64               `json:"tokens_sent"`
	BilledInputTokens  int64               `json:"billed_input_tokens"`
	BilledOutputTokens int64               `json:"billed_output_tokens"`
}

// Stats is the body of GET /stats: the server's identity, totals, and the
// retained records after Since, oldest first.
type Stats struct {
	Model     string  `json:"model"`
	Workload  string  `json:"workload"`
	Route     int     `json:"route"`
	Seed      uint64  `json:"seed"`
	TimeScale float64 `json:"time_scale"`

	Since uint64 `json:"since"`
	// NextSince is the value to pass as ?since= next time: the last
	// returned record's Seq, or Since when none was returned.
	NextSince uint64 `json:"next_since"`
	// Dropped counts records after Since that the ring evicted before they
	// were fetched; a poller that sees it nonzero fetched too rarely.
	Dropped uint64 `json:"dropped"`
	// More is set when Limit cut the answer short.
	More     bool     `json:"more"`
	Totals   Totals   `json:"totals"`
	Requests []Record `json:"requests"`
}

// statsBook keeps the last records in a ring and the lifetime totals.
type statsBook struct {
	mu     sync.Mutex
	ring   []Record // record seq s lives at ring[(s-1)%len(ring)]
	next   uint64   // seq of the next record
	totals Totals
}

func newStatsBook(capacity int) *statsBook {
	return &statsBook{
		ring: make([]Record, capacity),
		next: 1,
		totals: Totals{
			ByOutcome: make(map[string]int64),
			ByEnd:     make(map[EndReason]int64),
		},
	}
}

func (b *statsBook) begin() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.totals.Requests++
	b.totals.InFlight++
}

func (b *statsBook) invalid() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.totals.Invalid++
}

// finish stores rec under the next seq and returns it with the seq set.
func (b *statsBook) finish(rec Record) Record {
	b.mu.Lock()
	defer b.mu.Unlock()
	rec.Seq = b.next
	b.next++
	b.ring[(rec.Seq-1)%uint64(len(b.ring))] = rec
	t := &b.totals
	t.InFlight--
	t.ByOutcome[rec.Outcome]++
	t.ByEnd[rec.End]++
	t.TokensSent += int64(rec.TokensSent)
	t.BilledInputTokens += rec.BilledInputTokens
	t.BilledOutputTokens += rec.BilledOutputTokens
	return rec
}

// errSinceAhead reports a ?since= past the last record, which happens when
// a poller talks to a restarted server; answering "nothing new" would hide
// every record of the new run.
var errSinceAhead = errors.New("since is ahead of the last record")

// snapshot returns the totals and up to limit (0: all) retained records
// with a seq greater than since.
func (b *statsBook) snapshot(since uint64, limit int) (Stats, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	last := b.next - 1
	if since > last {
		return Stats{}, fmt.Errorf("%w: since %d, last record %d (did the server restart?)", errSinceAhead, since, last)
	}
	st := Stats{Since: since, NextSince: since, Totals: b.totals, Requests: []Record{}}
	st.Totals.ByOutcome = maps.Clone(b.totals.ByOutcome)
	st.Totals.ByEnd = maps.Clone(b.totals.ByEnd)

	oldest := uint64(1)
	if n := uint64(len(b.ring)); last > n {
		oldest = last - n + 1
	}
	from := since + 1
	if from < oldest {
		st.Dropped = oldest - from
		from = oldest
	}
	to := last
	if limit > 0 && to >= from && to-from+1 > uint64(limit) {
		to = from + uint64(limit) - 1
		st.More = true
	}
	for seq := from; seq <= to; seq++ {
		st.Requests = append(st.Requests, b.ring[(seq-1)%uint64(len(b.ring))])
	}
	if len(st.Requests) > 0 {
		st.NextSince = to
	}
	return st, nil
}
