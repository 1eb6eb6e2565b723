package node

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/redistest"
)

// TestServeExportsEveryOperatorMetricFromTheStart: a started serve, before
// any request, with and without Redis, exports each series a dashboard or an
// alert reads, with its label set: the duplicate rate, the guardrail's state
// and reason, the tail gain (NaN below its floor, beside its sample
// counts) and the stall bound per cohort, suppressions of every reason, ceiling
// breaches, route states, NATS connections, records' and workers' failure
// counts, answers not kept for replay. deploy/deploy_test.go checks the same for every series the
// dashboard and the alert rules name. An absent series reads as "no data", which an alert cannot tell
// from a healthy zero.
func TestServeExportsEveryOperatorMetricFromTheStart(t *testing.T) {
	const cohort = `cohort="default/general/stream/mt1024"`
	want := []string{
		`hedgerow_duplicate_rate{` + cohort + `} 0`,
		`hedgerow_duplicate_rate_ceiling{` + cohort + `} 0.08`,
		`hedgerow_stall_bound_seconds{` + cohort + `} 2`,
		`hedgerow_guardrail_state{` + cohort + `,state="enabled"} 1`,
		`hedgerow_guardrail_state{` + cohort + `,state="disabled"} 0`,
		`hedgerow_guardrail_state{` + cohort + `,state="probing"} 0`,
		`hedgerow_guardrail_reason{` + cohort + `,reason="insufficient_samples"} 1`,
		`hedgerow_guardrail_reason{` + cohort + `,reason="duplicate_ceiling"} 0`,
		`hedgerow_guardrail_reason{` + cohort + `,reason="error_rate"} 0`,
		`hedgerow_tail_gain_ratio{` + cohort + `} NaN`,
		`hedgerow_tail_gain_ratio_lower{` + cohort + `} NaN`,
		`hedgerow_tail_gain_ratio_upper{` + cohort + `} NaN`,
		`hedgerow_tail_gain_samples{arm="control",` + cohort + `} 0`,
		`hedgerow_tail_gain_samples{arm="hedged",` + cohort + `} 0`,
		`hedgerow_duplicate_rate{cohort="default/general/embeddings/mt0"} 0`,
		`hedgerow_hedges_suppressed_total{reason="guardrail"} 0`,
		`hedgerow_hedges_suppressed_total{reason="control"} 0`,
		`hedgerow_hedges_suppressed_total{reason="duplicate_rate"} 0`,
		`hedgerow_hedges_suppressed_total{reason="not_eligible"} 0`,
		`hedgerow_guardrail_breaches_total{reason="duplicate_ceiling"} 0`,
		`hedgerow_guardrail_breaches_total{reason="spend_ceiling"} 0`,
		`hedgerow_attempts_total{role="hedge"} 0`,
		`hedgerow_usage_units_total{kind="output",role="hedge"} 0`,
		`hedgerow_busy_total{pool="general"} 0`,
		`hedgerow_pool_without_workers{pool="general"} 0`,
		`hedgerow_route_state{route="fake-a",state="healthy"} 1`,
		`hedgerow_route_state{route="fake-b",state="ejected"} 0`,
		`hedgerow_nats_connected{conn="gateway"} 1`,
		`hedgerow_nats_connected{conn="workers"} 1`,
		`hedgerow_nats_reconnects_total{conn="gateway"} 0`,
		`hedgerow_records_publish_failures_total{reason="dropped"} 0`,
		`hedgerow_records_publish_failures_total{reason="error"} 0`,
		`hedgerow_worker_lease_errors_total{op="acquire",route="fake-a"} 0`,
		`hedgerow_worker_cancellations_total{observed="false"} 0`,
		`hedgerow_worker_inflight{route="fake-b"} 0`,
		`hedgerow_worker_max_inflight{route="fake-b"} 64`,
		`hedgerow_groups_in_flight 0`,
		`hedgerow_replay_answers_not_kept_total{reason="store_full"} 0`,
		`hedgerow_replay_answers_not_kept_total{reason="evicted"} 0`,
	}
	tests := []struct {
		name  string
		redis bool
	}{
		{"without redis", false},
		{"with redis", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			extra := ""
			if tt.redis {
				rs := redistest.Start(t)
				t.Setenv("NODE_TEST_HASH_KEY", "node-test-hash-key")
				extra = "redis: {url: \"" + rs.URL() + "\", key_prefix: nodetest, hash_key_env: NODE_TEST_HASH_KEY}\n"
			}
			s, err := StartServe(parse(t, fakeRoute(t, 0), fakeRoute(t, 1), extra), Options{})
			if err != nil {
				t.Fatalf("StartServe: %v", err)
			}
			defer stop(t, s)
			status, body := get(t, "http://"+s.HTTPAddr().String()+"/metrics")
			if status != http.StatusOK {
				t.Fatalf("metrics: %d", status)
			}
			lines := map[string]bool{}
			for _, l := range strings.Split(string(body), "\n") {
				lines[l] = true
			}
			for _, w := range want {
				if !lines[w] {
					t.Errorf("/metrics lacks the line %s", w)
				}
			}
		})
	}
}

// TestServeAdoptsAPeerReplicasDisablingThroughRedis: another replica of
// the same Redis disabled a cohort (its guardshare entry); within a sync or
// two this serve's guardrail holds the cohort disabled for that reason too.
func TestServeAdoptsAPeerReplicasDisablingThroughRedis(t *testing.T) {
	rs := redistest.Start(t)
	t.Setenv("NODE_TEST_HASH_KEY", "node-test-hash-key")
	extra := "redis: {url: \"" + rs.URL() + "\", key_prefix: nodetest, hash_key_env: NODE_TEST_HASH_KEY}\n"
	s, err := StartServe(parse(t, fakeRoute(t, 0), fakeRoute(t, 1), extra), Options{})
	if err != nil {
		t.Fatalf("StartServe: %v", err)
	}
	defer stop(t, s)
	const cohort = "default/general/stream/mt1024"
	if err := rs.Client().HSet(t.Context(), "nodetest:{gr:default}", cohort,
		"error_rate|"+strconv.FormatInt(time.Now().UnixMilli(), 10)).Err(); err != nil {
		t.Fatal(err)
	}
	line := `hedgerow_guardrail_reason{cohort="` + cohort + `",reason="error_rate"} 1`
	eventually.True(t, wait, "the peer's disabling adopted", func() bool {
		status, body := get(t, "http://"+s.HTTPAddr().String()+"/metrics")
		return status == http.StatusOK && strings.Contains(string(body), line) &&
			strings.Contains(string(body), `hedgerow_guardrail_state{cohort="`+cohort+`",state="disabled"} 1`)
	})
}
