package config

import (
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets/lease"
	"github.com/hedgerow/hedgerow/budgets/lease/natslease"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/dispatcher/route"
	"github.com/hedgerow/hedgerow/internal/adapters/records"
	"github.com/hedgerow/hedgerow/schemas"
)

// defaultSetting is the value a key takes when the file leaves it out. In
// Path, "*" stands for every entry of a map or list.
type defaultSetting struct {
	Path  string
	Value any
}

// policyDefaults are the values a policy takes for the keys it leaves out;
// dispatcher/policy defines them, so the simulator runs the same.
var policyDefaults = policy.Default()

// healthDefaults are a pool's outlier-detection defaults; dispatcher/route
// defines them.
var healthDefaults = route.DefaultHealthOptions()

// defaults is every default of the configuration, in one table. Keys not
// listed here default to their zero value (empty, false, 0). Load adds a
// policy named "default" when the file has none before applying the table,
// so that policy gets every value below.
var defaults = []defaultSetting{
	{"nats.max_payload", 8 * ByteSize(1<<20)},

	{"redis.timeout", 100 * time.Millisecond},
	{"redis.key_prefix", "hr"},

	{"gate.on_unavailable", "fallback"},
	{"gate.bucket", "hedgerow_gate"},
	{"gate.replicas", 1},
	{"gate.timeout", time.Second},

	{"records.stream", records.DefaultStream},
	{"records.max_age", 7 * 24 * time.Hour},
	{"records.max_bytes", ByteSize(1 << 30)},
	{"records.replicas", 1},
	{"records.duplicates", 2 * time.Minute},
	{"records.max_pending", 4096},
	{"records.commit_timeout", time.Second},
	{"tracing.sample_ratio", 1.0},

	{"global.rebalance_interval", 2 * time.Second},
	{"global.lease_validity", lease.DefaultValidity},
	{"global.max_clock_skew", lease.DefaultSkew},
	{"global.authority.bucket", natslease.DefaultBucket},
	{"global.authority.replicas", 1},
	{"global.rerun_after", 30 * time.Second},
	{"global.index_max_bytes", ByteSize(1 << 30)},

	{"http.listen", "127.0.0.1:8080"},
	{"http.body_limit", 4 * ByteSize(1<<20)},
	{"http.header_limit", 64 * ByteSize(1<<10)},
	{"http.max_connections", 4096},
	{"http.read_timeout", 10 * time.Second},
	{"http.read_header_timeout", 5 * time.Second},
	{"http.write_timeout", 60 * time.Second}, // ≥ the longest deadline, streams included
	{"http.idle_timeout", 120 * time.Second},
	{"http.idempotency.ttl", 24 * time.Hour},
	{"http.idempotency.max_entry_bytes", 4 * ByteSize(1<<20)},
	{"http.idempotency.max_total_bytes", 256 * ByteSize(1<<20)},
	{"http.idempotency.lease", 5 * time.Second},

	{"schema_cache.max_bytes", ByteSize(arbiter.DefaultSchemaCacheBytes)},
	{"schema_cache.max_entries", arbiter.DefaultSchemaCacheEntries},
	{"schema_cache.compile_timeout", arbiter.DefaultSchemaCompileTimeout},

	{"routes.*.max_inflight", 64},
	{"routes.*.continuation", ContinuationNone},
	{"pools.*.queue_wait", time.Second},
	{"pools.*.rescue.mode", RescueOff},
	{"pools.*.rescue.max", 1},
	{"pools.*.outlier_detection.consecutive_failures", healthDefaults.ConsecutiveFailures},
	{"pools.*.outlier_detection.failure_rate", healthDefaults.FailureRate},
	{"pools.*.outlier_detection.min_requests", healthDefaults.MinRequests},
	{"pools.*.outlier_detection.window", healthDefaults.Window},
	{"pools.*.outlier_detection.base_ejection", healthDefaults.BaseEjection},
	{"pools.*.outlier_detection.max_ejection", healthDefaults.MaxEjection},
	{"pools.*.outlier_detection.max_ejected_percent", healthDefaults.MaxEjectedPercent},

	{"policies.*.hedge", policyDefaults.Hedge},
	{"policies.*.idempotent", policyDefaults.Idempotent},
	{"policies.*.rollout_fraction", policyDefaults.RolloutFraction},
	{"policies.*.control_fraction", policyDefaults.ControlFraction},
	{"policies.*.trigger", policyDefaults.Trigger},
	{"policies.*.max_attempts", policyDefaults.MaxAttempts},
	{"policies.*.delay.quantile", policyDefaults.Delay.Quantile},
	{"policies.*.delay.min", policyDefaults.Delay.Min},
	{"policies.*.delay.max", policyDefaults.Delay.Max},
	{"policies.*.delay.initial", policyDefaults.Delay.Initial},
	{"policies.*.delay.warmup_samples", policyDefaults.Delay.WarmupSamples},
	{"policies.*.delay.window", policyDefaults.Delay.Window},
	{"policies.*.delay.slots", policyDefaults.Delay.Slots},
	{"policies.*.min_useful_time", policyDefaults.MinUsefulTime},
	{"policies.*.deadline", policyDefaults.Deadline},
	{"policies.*.commit_point", policyDefaults.CommitPoint},
	{"policies.*.duplicate_rate.ceiling", policyDefaults.DuplicateRate.Ceiling},
	{"policies.*.duplicate_rate.window", policyDefaults.DuplicateRate.Window},
	{"policies.*.duplicate_rate.burst_window", policyDefaults.DuplicateRate.BurstWindow},
	{"policies.*.duplicate_rate.burst_ceiling", policyDefaults.DuplicateRate.BurstCeiling},
	{"policies.*.duplicate_rate.replacement_reserve", policyDefaults.DuplicateRate.ReplacementReserve},
	{"policies.*.duplicate_rate.reserve.burst", policyDefaults.DuplicateRate.Reserve.Burst},
	{"policies.*.duplicate_rate.reserve.per_minute", policyDefaults.DuplicateRate.Reserve.PerMinute},
	{"policies.*.spend.window", policyDefaults.Spend.Window},
	{"policies.*.accept_timeout", policyDefaults.AcceptTimeout},
	{"policies.*.heartbeat_interval", policyDefaults.HeartbeatInterval},
	{"policies.*.heartbeat_timeout", policyDefaults.HeartbeatTimeout},
	{"policies.*.stall_after_first_token", policyDefaults.StallAfterFirstToken},
	{"policies.*.stall_floor", policyDefaults.StallFloor},
	{"policies.*.guardrail.enabled", policyDefaults.Guardrail.Enabled},
	{"policies.*.guardrail.quantile", policyDefaults.Guardrail.Quantile},
	{"policies.*.guardrail.min_control_samples", policyDefaults.Guardrail.MinControlSamples},
	{"policies.*.guardrail.min_error_samples", policyDefaults.Guardrail.MinErrorSamples},
	{"policies.*.guardrail.min_gain", policyDefaults.Guardrail.MinGain},
	{"policies.*.guardrail.max_error_rate_increase", policyDefaults.Guardrail.MaxErrorRateIncrease},
	{"policies.*.guardrail.probe_interval", policyDefaults.Guardrail.ProbeInterval},
	{"policies.*.pushback_scope", policyDefaults.PushbackScope},

	{"tenants.*.spend_window", 24 * time.Hour},
}

// applyDefaults sets every key of the defaults table that the file did not
// set (has reports what it did). An error means the table names a field that
// does not exist or has another type: a programming error, caught by tests.
func applyDefaults(c *Config, has func(path string) bool) error {
	if c.Policies == nil {
		c.Policies = map[string]*Policy{}
	}
	if c.Policies[DefaultPolicy] == nil {
		c.Policies[DefaultPolicy] = &Policy{}
	}
	root := reflect.ValueOf(c).Elem()
	for _, d := range defaults {
		err := setDefault(root, "", strings.Split(d.Path, "."), reflect.ValueOf(d.Value), has)
		if err != nil {
			return fmt.Errorf("default %s: %w", d.Path, err)
		}
	}
	// A region's own JetStream names carry the region (hedgerow_records_east,
	// hedgerow_gate_east): the regions of a supercluster share one
	// JetStream, so two regions' defaults would otherwise be one stream
	// and one bucket (docs/architecture.md §14). A name the file gives is
	// kept as given; the leases' bucket is every region's, one name.
	if r := c.Deployment.Region; r != "" {
		w := schemas.RegionWire(r)
		if !has("records.stream") {
			c.Records.Stream = w.JetStreamName(c.Records.Stream)
		}
		if !has("gate.bucket") {
			c.Gate.Bucket = w.JetStreamName(c.Gate.Bucket)
		}
	}
	// A stall_floor left to its default follows a smaller
	// stall_after_first_token, the bound's cap: a file that sets only the
	// cap, under the default floor, pins the bound there as before.
	for name, p := range c.Policies {
		if p != nil && p.StallAfterFirstToken > 0 && !has(joinPath(joinPath("policies", name), "stall_floor")) {
			p.StallFloor = min(p.StallFloor, p.StallAfterFirstToken)
		}
	}
	return nil
}

// setDefault walks segs from v (at path) and sets the field they name,
// expanding "*" over map entries and list items.
func setDefault(v reflect.Value, path string, segs []string, val reflect.Value, has func(string) bool) error {
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return nil // an absent entry has nothing to default
		}
		v = v.Elem()
	}
	if len(segs) == 0 {
		if has(path) {
			return nil
		}
		if !val.Type().AssignableTo(v.Type()) {
			return fmt.Errorf("value of type %s does not fit field of type %s", val.Type(), v.Type())
		}
		v.Set(val)
		return nil
	}
	seg, rest := segs[0], segs[1:]
	switch {
	case seg == "*" && v.Kind() == reflect.Map:
		for _, k := range v.MapKeys() {
			elem := v.MapIndex(k)
			if elem.Kind() != reflect.Pointer {
				return fmt.Errorf("map %s holds values, not pointers", path)
			}
			if err := setDefault(elem, joinPath(path, k.String()), rest, val, has); err != nil {
				return err
			}
		}
		return nil
	case seg == "*" && v.Kind() == reflect.Slice:
		for i := range v.Len() {
			if err := setDefault(v.Index(i), indexPath(path, i), rest, val, has); err != nil {
				return err
			}
		}
		return nil
	case v.Kind() == reflect.Struct:
		i, ok := yamlFields(v.Type())[seg]
		if !ok {
			return fmt.Errorf("%s has no key %q", v.Type(), seg)
		}
		return setDefault(v.Field(i), joinPath(path, seg), rest, val, has)
	}
	return fmt.Errorf("cannot step into %s with %q", v.Type(), seg)
}
