package config

import (
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
)

// defaultSetting is the value a key takes when the file leaves it out. In
// Path, "*" stands for every entry of a map or list.
type defaultSetting struct {
	Path  string
	Value any
}

// The engine's, the estimator's and the guardrail's own defaults, which the
// policy defaults below repeat rather than restate.
var (
	engine    = hedge.DefaultPolicy()
	delays    = delay.DefaultConfig()
	guardrail = delay.DefaultGuardrailConfig()
)

// defaults is every default of the configuration, in one table. Keys not
// listed here default to their zero value (empty, false, 0). Load adds a
// policy named "default" when the file has none before applying the table,
// so that policy gets every value below.
var defaults = []defaultSetting{
	{"nats.max_payload", 8 * ByteSize(1<<20)},

	{"redis.timeout", 100 * time.Millisecond},
	{"redis.key_prefix", "hr"},

	{"http.listen", "127.0.0.1:8080"},
	{"http.body_limit", 4 * ByteSize(1<<20)},
	{"http.read_timeout", 10 * time.Second},
	{"http.write_timeout", 60 * time.Second}, // ≥ the longest deadline, streams included
	{"http.idle_timeout", 120 * time.Second},

	{"routes.*.max_inflight", 64},

	{"policies.*.hedge", true},
	{"policies.*.idempotent", true}, // completions have no side effects at the provider
	{"policies.*.rollout_fraction", 1.0},
	{"policies.*.control_fraction", delay.DefaultControlFraction},
	{"policies.*.trigger", Trigger(engine.Trigger)},
	{"policies.*.max_attempts", engine.MaxAttempts},
	{"policies.*.delay.quantile", delays.Quantile},
	{"policies.*.delay.min", delays.Min},
	{"policies.*.delay.max", delays.Max},
	{"policies.*.delay.initial", delays.Initial},
	{"policies.*.delay.warmup_samples", delays.WarmupSamples},
	{"policies.*.delay.window", delays.Window},
	{"policies.*.delay.slots", delays.Slots},
	{"policies.*.min_useful_time", engine.MinUsefulTime},
	{"policies.*.deadline", engine.Deadline},
	{"policies.*.commit_point", engine.CommitPoint},
	// Measured with `hedgerow simulate` (the hedgerow strategy runs these
	// defaults): room above the ~5.5% a P95 delay asks for on gpt4o, and a
	// capacity small enough that no 10-second window of the degraded
	// workload goes more than 0.02 over the ceiling.
	{"policies.*.duplicate_rate.ceiling", 0.08},
	{"policies.*.duplicate_rate.capacity", 8.0},
	{"policies.*.duplicate_rate.initial_fill", 4.0},
	{"policies.*.duplicate_rate.replacement_reserve", 3.0},
	{"policies.*.duplicate_rate.pool_floor", 1.0},
	{"policies.*.duplicate_rate.pool_floor_refill", 0.05},
	{"policies.*.spend.window", time.Hour},
	{"policies.*.accept_timeout", engine.AcceptTimeout},
	{"policies.*.heartbeat_interval", engine.HeartbeatTimeout / 4},
	{"policies.*.heartbeat_timeout", engine.HeartbeatTimeout},
	{"policies.*.guardrail.enabled", true},
	{"policies.*.guardrail.quantile", guardrail.Quantile},
	{"policies.*.guardrail.min_control_samples", guardrail.MinControlSamples},
	{"policies.*.guardrail.min_gain", guardrail.MinRelativeGain},
	{"policies.*.guardrail.max_error_rate_increase", guardrail.ErrorRateMargin},
	{"policies.*.guardrail.probe_interval", guardrail.CoolDown},

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
