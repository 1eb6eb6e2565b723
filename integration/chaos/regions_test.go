//go:build chaos

package chaos

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/internal/tools/cluster"
	"github.com/hedgerow/hedgerow/internal/tools/regions"
)

var (
	regionsDirFlag   = flag.String("regions.dir", "../../bin/regions", "state directory of the running regions (make regions)")
	regionsRateFlag  = flag.Float64("regions.rate", 20, "requests a second over both regions")
	regionsSkewFlag  = flag.Float64("regions.skew", 0.8, "share of the requests sent to east; the rest go to west")
	regionsPhaseFlag = flag.Duration("regions.phase", 20*time.Second, "load time of the baseline and the Redis phase")
	regionsCutFlag   = flag.Duration("regions.cut", 60*time.Second, "how long the link stays cut")
	regionsRedisFlag = flag.String("regions.redis", "east", "the region whose Redis is restarted")
	regionsSeedFlag  = flag.Uint64("regions.seed", 1, "seed of the regions' skew")
	// regionsConvergeFlag bounds the wait for the shares after healing.
	regionsConvergeFlag = flag.Duration("regions.converge", 45*time.Second, "longest wait for the shares to converge after healing")
)

// budgetRefusals are the codes of a ceiling refusing, counted apart:
// a region held to its lease or safe share refuses so, by design.
var budgetRefusals = map[string]bool{
	frontdoor.CodeTenantRateLimited: true, frontdoor.CodeTenantConcurrencyLimited: true, "budget_exhausted": true,
}

// leaseSample is one reading of a region's lease metrics.
type leaseSample struct {
	share    map[string]float64 // hedgerow_lease_share by ceiling kind
	fallback map[string]float64 // hedgerow_lease_fallback by ceiling kind
	renewOK  float64
	renewErr float64
}

func (s leaseSample) onFallback() bool {
	for _, v := range s.fallback {
		if v > 0 {
			return true
		}
	}
	return false
}

// regionLoad is one phase's load over both regions and what the lease
// metrics read meanwhile.
type regionLoad struct {
	m        *regions.Manifest
	client   *http.Client
	run      string
	mu       sync.Mutex
	sent     map[string]int
	answered map[string]int
	refused  map[string]map[string]int // region → refusal code → count
	failed   map[string]map[string]int // region → failure code → count
	samples  map[string][]leaseSample
	wg       sync.WaitGroup
}

func newRegionLoad(m *regions.Manifest, run string) *regionLoad {
	l := &regionLoad{m: m, client: &http.Client{Timeout: clientDeadline}, run: run, sent: map[string]int{}, answered: map[string]int{},
		refused: map[string]map[string]int{}, failed: map[string]map[string]int{}, samples: map[string][]leaseSample{}}
	for _, r := range regions.Names {
		l.refused[r], l.failed[r] = map[string]int{}, map[string]int{}
	}
	return l
}

// TestChaosRegions runs against make regions: a steady load skewed
// between the regions; the link cut for -regions.cut and healed, timing
// how long the lease shares take to converge; one region's Redis
// restarted on its AOF. A table per phase.
func TestChaosRegions(t *testing.T) {
	dir, err := filepath.Abs(*regionsDirFlag)
	if err != nil {
		t.Fatal(err)
	}
	m, err := regions.ReadManifest(dir)
	if err != nil {
		t.Fatalf("no regions in %s (make regions): %v", dir, err)
	}
	if !regions.IsUp(dir) {
		t.Fatalf("the regions in %s are not wholly up (hedgerow regions status --dir %s)", dir, dir)
	}
	heal := false
	if err := m.Link(context.Background(), -1, &heal); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Link(context.Background(), -1, &heal) }) // never leave the link cut
	rng := rand.New(rand.NewPCG(*regionsSeedFlag, 29))
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	start := time.Now()
	var tables []string
	report := func(name, did string, l *regionLoad, extra string) {
		tb := l.table(name, did) + extra
		tables = append(tables, tb)
		fmt.Print(tb)
		if !regions.IsUp(dir) {
			t.Errorf("%s: the regions are not wholly up after the phase", name)
		}
	}

	// Baseline: the shares the skew settles on.
	base := newRegionLoad(m, run+"-base")
	base.runFor(t, rng, *regionsPhaseFlag, nil)
	settled := base.lastShares("tenant_rate", 5)
	report("baseline (link up)", "nothing", base, fmt.Sprintf("   settled tenant_rate shares: %s\n", formatShares(settled)))

	// The link cut, then healed under the same load; the phase ends once
	// the shares have converged (or the bound passed).
	cut := newRegionLoad(m, run+"-cut")
	var converged time.Duration = -1
	cut.runFor(t, rng, *regionsCutFlag+*regionsConvergeFlag, func(ctx context.Context, stop func()) {
		on := true
		if err := m.Link(ctx, -1, &on); err != nil {
			t.Error(err)
			return
		}
		select {
		case <-time.After(*regionsCutFlag):
		case <-ctx.Done():
			return
		}
		off := false
		if err := m.Link(ctx, -1, &off); err != nil {
			t.Error(err)
			return
		}
		healed := time.Now()
		converged = cut.waitConverged(ctx, settled)
		if converged >= 0 {
			converged = time.Since(healed)
		}
		stop()
	})
	conv := fmt.Sprintf("   shares did not converge within %v of healing (each region off its safe share, tenant_rate within 0.1 of its settled share)\n", *regionsConvergeFlag)
	if converged >= 0 {
		conv = fmt.Sprintf("   shares converged %.1f s after healing (each region off its safe share, tenant_rate within 0.1 of its settled share)\n", converged.Seconds())
	}
	report(fmt.Sprintf("link cut for %v, then healed", *regionsCutFlag), fmt.Sprintf("cut both ways (packets held) for %v, then healed", *regionsCutFlag), cut, conv)

	// One region's Redis restarted on its AOF, a quarter in.
	rr := newRegionLoad(m, run+"-redis")
	name := regions.RedisName(*regionsRedisFlag)
	var did string
	rr.runFor(t, rng, *regionsPhaseFlag, func(ctx context.Context, _ func()) {
		select {
		case <-time.After(*regionsPhaseFlag / 4):
		case <-ctx.Done():
			return
		}
		did = restartPart(t, m, name)
	})
	report("restart "+name, did, rr, "")

	fmt.Printf("\n== chaos-regions: 3 phases in %s (rate %.0f/s, %.0f%% to east, link %s) ==\n",
		time.Since(start).Round(time.Second), *regionsRateFlag, 100**regionsSkewFlag, linkState(m))
	for _, tb := range tables {
		fmt.Print(tb)
	}
	for _, l := range []*regionLoad{base, cut, rr} {
		l.check(t)
	}
}

// restartPart stops a part with SIGTERM and starts it again on its data.
func restartPart(t *testing.T, m *regions.Manifest, name string) string {
	p, ok := m.Part(name)
	if !ok {
		t.Fatalf("no part %s", name)
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for p.Running() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // another process's exit: polled
	}
	if err := m.Restart(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	return "SIGTERM " + name + " (AOF), started again at once"
}

func linkState(m *regions.Manifest) string {
	s, err := m.LinkState(context.Background())
	if err != nil {
		return err.Error()
	}
	return s
}

// runFor sends the skewed load for d (or until the fault calls stop),
// reading both gateways' lease metrics every second; fault, when set,
// runs beside the load.
func (l *regionLoad) runFor(t *testing.T, rng *rand.Rand, d time.Duration, fault func(ctx context.Context, stop func())) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var bg sync.WaitGroup
	bg.Add(2)
	go func() {
		defer bg.Done()
		tick := time.NewTicker(time.Duration(float64(time.Second) / *regionsRateFlag))
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				region := regions.Names[1]
				if rng.Float64() < *regionsSkewFlag {
					region = regions.Names[0]
				}
				l.wg.Add(1)
				go l.send(region, fmt.Sprintf("%s-%d", l.run, n))
			}
		}
	}()
	go func() {
		defer bg.Done()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				l.sample(ctx)
			}
		}
	}()
	if fault != nil {
		fault(ctx, cancel)
	}
	<-ctx.Done()
	bg.Wait()
	l.wg.Wait()
}

// send is one request in region, retried in the same region (as its
// clients would) after a retryable failure other than a ceiling's refusal.
func (l *regionLoad) send(region, key string) {
	defer l.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), clientDeadline)
	defer cancel()
	code, first := "", ""
	for try := 0; try < 3; try++ {
		var retry bool
		code, retry = l.try(ctx, region, key)
		if try == 0 {
			first = code
		}
		if code == "" || budgetRefusals[code] || !retry || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(200*(try+1)) * time.Millisecond):
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sent[region]++
	switch {
	case code == "":
		l.answered[region]++
	case budgetRefusals[code] && first == code:
		l.refused[region][code]++
	case first != code:
		// A refusal of a retry (its attempts spent by the first try) is
		// the first try's failure, not a ceiling's.
		l.failed[region][first+", then "+code]++
	default:
		l.failed[region][code]++
	}
}

// try is one HTTP request: "" when answered, else the failure's code and
// whether a client would retry.
func (l *regionLoad) try(ctx context.Context, region, key string) (string, bool) {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"regions %s"}],"max_tokens":20}`, cluster.Pool, key)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.m.GatewayURL(region)+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return "client:" + err.Error(), false
	}
	req.Header.Set("Authorization", "Bearer "+cluster.TenantKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(frontdoor.HeaderIdempotencyKey, key)
	resp, err := l.client.Do(req)
	if err != nil {
		return "transport:" + transportKind(err), true
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return "transport:" + transportKind(err), true
	}
	if resp.StatusCode != http.StatusOK {
		code := errorCode(data)
		if code == "" {
			code = fmt.Sprintf("http_%d", resp.StatusCode)
		}
		return code, resp.Header.Get("X-Should-Retry") == "true"
	}
	return "", false
}

// sample reads each gateway's lease metrics once.
func (l *regionLoad) sample(ctx context.Context) {
	for _, r := range regions.Names {
		s, err := readLeaseMetrics(ctx, l.m.GatewayURL(r)+"/metrics")
		if err != nil {
			continue
		}
		l.mu.Lock()
		l.samples[r] = append(l.samples[r], s)
		l.mu.Unlock()
	}
}

func readLeaseMetrics(ctx context.Context, url string) (leaseSample, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s := leaseSample{share: map[string]float64{}, fallback: map[string]float64{}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return s, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, rest, ok := strings.Cut(line, "{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		switch name {
		case "hedgerow_lease_share":
			s.share[label(labels, "kind")] = v
		case "hedgerow_lease_fallback":
			s.fallback[label(labels, "kind")] = v
		case "hedgerow_lease_renewals_total":
			if label(labels, "result") == "ok" {
				s.renewOK = v
			} else {
				s.renewErr = v
			}
		}
	}
	return s, sc.Err()
}

// label is a label's value in a Prometheus text line's label set.
func label(labels, name string) string {
	for _, kv := range strings.Split(labels, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// lastShares is each region's mean share of kind over its last n samples.
func (l *regionLoad) lastShares(kind string, n int) map[string]float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]float64{}
	for r, ss := range l.samples {
		ss = ss[max(0, len(ss)-n):]
		sum := 0.0
		for _, s := range ss {
			sum += s.share[kind]
		}
		if len(ss) > 0 {
			out[r] = sum / float64(len(ss))
		}
	}
	return out
}

// waitConverged polls both gateways until each region is off its safe
// share and its tenant_rate share is within 0.1 of settled; -1 when ctx
// ends first.
func (l *regionLoad) waitConverged(ctx context.Context, settled map[string]float64) time.Duration {
	start := time.Now()
	for {
		ok := true
		for _, r := range regions.Names {
			s, err := readLeaseMetrics(ctx, l.m.GatewayURL(r)+"/metrics")
			if err != nil || s.onFallback() || math.Abs(s.share["tenant_rate"]-settled[r]) > 0.1 {
				ok = false
				break
			}
		}
		if ok {
			return time.Since(start)
		}
		select {
		case <-ctx.Done():
			return -1
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func formatShares(shares map[string]float64) string {
	var parts []string
	for _, r := range regions.Names {
		parts = append(parts, fmt.Sprintf("%s %.3f", r, shares[r]))
	}
	return strings.Join(parts, ", ")
}

// table is the phase's report: per region, the requests and their ends,
// and what its gateway's lease metrics read over the phase.
func (l *regionLoad) table(name, did string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "\n-- %s --\n   fault: %s\n", name, did)
	fmt.Fprintf(&b, "   %-6s %6s %9s %8s %7s   %-26s %-9s %s\n", "region", "sent", "answered", "refused", "failed",
		"tenant_rate share min–max", "fallback", "renewals ok/error")
	for _, r := range regions.Names {
		refused, failed := 0, 0
		for _, n := range l.refused[r] {
			refused += n
		}
		for _, n := range l.failed[r] {
			failed += n
		}
		lo, hi, fb := math.Inf(1), math.Inf(-1), 0
		ss := l.samples[r]
		for _, s := range ss {
			lo, hi = math.Min(lo, s.share["tenant_rate"]), math.Max(hi, s.share["tenant_rate"])
			if s.onFallback() {
				fb++
			}
		}
		renew := "-"
		if len(ss) > 1 {
			renew = fmt.Sprintf("+%.0f/+%.0f", ss[len(ss)-1].renewOK-ss[0].renewOK, ss[len(ss)-1].renewErr-ss[0].renewErr)
		}
		shares := "-"
		if len(ss) > 0 {
			shares = fmt.Sprintf("%.3f–%.3f", lo, hi)
		}
		fmt.Fprintf(&b, "   %-6s %6d %9d %8d %7d   %-26s %-9s %s\n", r, l.sent[r], l.answered[r], refused, failed,
			shares, fmt.Sprintf("%d/%d s", fb, len(ss)), renew)
		for _, code := range slices.Sorted(maps.Keys(l.refused[r])) {
			fmt.Fprintf(&b, "          refused %-30s %d\n", code, l.refused[r][code])
		}
		for _, code := range slices.Sorted(maps.Keys(l.failed[r])) {
			fmt.Fprintf(&b, "          failed  %-30s %d\n", code, l.failed[r][code])
		}
	}
	return b.String()
}

// check fails the suite on a failure other than a ceiling's refusal.
func (l *regionLoad) check(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range regions.Names {
		for code, n := range l.failed[r] {
			t.Errorf("%s: %d requests failed with %s (not a ceiling's refusal)", r, n, code)
		}
	}
}
