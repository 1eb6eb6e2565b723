package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// commitWaitMetric is serve's histogram of the wait for the records
// stream's ack of a committed group's record, which every answer waits
// for (internal/adapters/records): with sync_interval always, an fsync on
// the request path.
const commitWaitMetric = "hedgerow_records_commit_publish_seconds"

// batchMetric is serve's histogram of records per batch message: with
// sync_interval always, each batch is an fsync.
const batchMetric = "hedgerow_records_batch_records"

// recordsSeen is what serve's records cost over a window: the answers'
// waits for their commit records and the batch messages.
type recordsSeen struct{ wait, batches histogram }

// String reads "p50 ≤ 0.4 ms, p99 ≤ 6.4 ms, mean 0.61 ms (10017); 10020
// batch messages (fsyncs), 3.0 records each".
func (r recordsSeen) String() string {
	return fmt.Sprintf("%v; %.0f batch messages (fsyncs), %.1f records each", r.wait, r.batches.count, r.batches.mean())
}

// scrapeRecords reads serve's recordsSeen from its metrics at url.
func scrapeRecords(ctx context.Context, url string) (recordsSeen, error) {
	hs, err := scrapeHistograms(ctx, url, commitWaitMetric, batchMetric)
	if err != nil {
		return recordsSeen{}, err
	}
	return recordsSeen{wait: hs[0], batches: hs[1]}, nil
}

// The two parts of a race's cancel serve times itself (docs/architecture.md
// §12, "Cancels"): the dispatcher's, from the reply that decided the race
// to the loser's cancel published, and the worker's, from the cancel
// received to its provider call returned. What the provider sees beyond
// them is the way there and back: the winner's first token from the
// provider through its worker and NATS to the dispatcher, the cancel
// through NATS to the loser's worker, the disconnect to the provider.
const (
	cancelDispatchMetric = "hedgerow_cancel_dispatch_seconds"
	cancelWorkerMetric   = "hedgerow_cancel_latency_seconds"
)

// cancelParts is what serve timed of its cancels over a window.
type cancelParts struct{ dispatch, worker histogram }

// scrapeCancelParts reads serve's cancelParts from its metrics at url.
func scrapeCancelParts(ctx context.Context, url string) (cancelParts, error) {
	hs, err := scrapeHistograms(ctx, url, cancelDispatchMetric, cancelWorkerMetric)
	if err != nil {
		return cancelParts{}, err
	}
	return cancelParts{dispatch: hs[0], worker: hs[1]}, nil
}

// minus is what c counted since o.
func (c cancelParts) minus(o cancelParts) cancelParts {
	return cancelParts{dispatch: c.dispatch.minus(o.dispatch), worker: c.worker.minus(o.worker)}
}

// histogram is a Prometheus histogram as its text exposition gives it:
// cumulative bucket counts by upper bound (seconds), sum and count.
type histogram struct {
	les    []float64 // ascending, +Inf last
	counts []float64 // cumulative, per le
	sum    float64
	count  float64
}

// parseHistogram reads the unlabelled histogram name from a Prometheus
// text exposition.
func parseHistogram(r io.Reader, name string) (histogram, error) {
	var h histogram
	found := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		key, value, ok := strings.Cut(line, " ")
		if !ok || !strings.HasPrefix(key, name) {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return histogram{}, fmt.Errorf("metric %s: %q: %w", name, line, err)
		}
		switch rest := key[len(name):]; {
		case rest == "_sum":
			h.sum, found = v, true
		case rest == "_count":
			h.count, found = v, true
		case strings.HasPrefix(rest, `_bucket{le="`) && strings.HasSuffix(rest, `"}`):
			le, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimPrefix(rest, `_bucket{le="`), `"}`), 64)
			if err != nil {
				return histogram{}, fmt.Errorf("metric %s: bucket %q: %w", name, rest, err)
			}
			h.les, h.counts, found = append(h.les, le), append(h.counts, v), true
		}
	}
	if err := sc.Err(); err != nil {
		return histogram{}, fmt.Errorf("metric %s: %w", name, err)
	}
	if !found {
		return histogram{}, fmt.Errorf("metric %s: not exported", name)
	}
	if !slices.IsSorted(h.les) {
		return histogram{}, fmt.Errorf("metric %s: buckets out of order", name)
	}
	return h, nil
}

// minus is what h counted since o (an earlier scrape of the same series).
func (h histogram) minus(o histogram) histogram {
	out := histogram{les: h.les, counts: make([]float64, len(h.counts)), sum: h.sum - o.sum, count: h.count - o.count}
	for i := range h.counts {
		out.counts[i] = h.counts[i]
		if i < len(o.counts) {
			out.counts[i] -= o.counts[i]
		}
	}
	return out
}

// quantile is the upper bound of the bucket holding the q quantile (in
// seconds; +Inf past the last finite bound, NaN with no observation).
func (h histogram) quantile(q float64) float64 {
	if h.count <= 0 {
		return math.NaN()
	}
	for i, c := range h.counts {
		if c >= q*h.count {
			return h.les[i]
		}
	}
	return math.Inf(1)
}

// mean is sum over count, in seconds (NaN with no observation).
func (h histogram) mean() float64 {
	if h.count <= 0 {
		return math.NaN()
	}
	return h.sum / h.count
}

// String reads "p50 ≤ 0.4 ms, p99 ≤ 6.4 ms, mean 0.61 ms (10017)".
func (h histogram) String() string {
	if h.count <= 0 {
		return "none"
	}
	bound := func(q float64) string {
		v := h.quantile(q)
		if math.IsInf(v, 1) {
			return fmt.Sprintf("> %g ms", 1000*h.les[len(h.les)-2])
		}
		return fmt.Sprintf("≤ %g ms", 1000*v)
	}
	return fmt.Sprintf("p50 %s, p99 %s, mean %.3f ms (%.0f)", bound(0.5), bound(0.99), 1000*h.mean(), h.count)
}

// scrapeHistograms reads the named histograms from one scrape of the
// metrics at url, in the order named.
func scrapeHistograms(ctx context.Context, url string, names ...string) ([]histogram, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %d", url, resp.StatusCode)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	hs := make([]histogram, len(names))
	for i, name := range names {
		if hs[i], err = parseHistogram(bytes.NewReader(body), name); err != nil {
			return nil, err
		}
	}
	return hs, nil
}
