package config

import (
	"encoding"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// nodeUnmarshaler is implemented by field types that decode themselves from
// a YAML node; the error is reported at the node's line and path.
type nodeUnmarshaler interface {
	unmarshalNode(n *yaml.Node) error
}

var durationType = reflect.TypeFor[time.Duration]()

// retiredKeys names, per section type, keys an earlier version accepted and
// what to write instead, so that an old configuration fails with a way
// forward rather than a bare unknown key.
var retiredKeys = map[reflect.Type]map[string]string{
	reflect.TypeFor[DuplicateRate](): {
		"capacity": "the duplicate-rate ceiling is a rate over a sliding window, not a token bucket " +
			"(docs/architecture.md §7); delete it and set duplicate_rate.window (default 1m) and burst_window (default 10s) if the defaults do not suit",
		"initial_fill": "the duplicate-rate ceiling is a rate over a sliding window, not a token bucket " +
			"(docs/architecture.md §7); delete it: a cold pool hedges on its reserve (duplicate_rate.reserve)",
		"pool_floor":        floorBecameReserve,
		"pool_floor_refill": floorBecameReserve,
	},
}

// floorBecameReserve is what replaced the pool's floor of one hedge.
const floorBecameReserve = "the pool's floor became its reserve (docs/architecture.md §7); " +
	"write duplicate_rate.reserve: {burst: <hedges at once>, per_minute: <refill>} (default {burst: 5, per_minute: 6})"

// decoder fills Go values from a yaml.Node tree by their yaml tags, strictly:
// unknown and duplicate keys, wrong kinds and unparsable scalars are all
// reported, and decoding goes on after each so that one pass finds them all.
// yaml.v3's own strict decoding stops at the first unknown key and does not
// name field paths, hence this walker.
type decoder struct {
	*reporter
}

// decode fills v from n; line is where path is written (its key's line, or
// the item's line in a list), recorded so later problems can point at it.
func (d *decoder) decode(n *yaml.Node, path string, line int, v reflect.Value) {
	n = resolveAlias(n)
	if isNull(n) {
		return // an explicit null leaves the key unset, so its default applies
	}
	if path != "" {
		d.lines[path] = line
	}

	if v.CanAddr() {
		if u, ok := v.Addr().Interface().(nodeUnmarshaler); ok {
			if err := u.unmarshalNode(n); err != nil {
				d.decodeFailed(path, n.Line, "%v", err)
			}
			return
		}
		if u, ok := v.Addr().Interface().(encoding.TextUnmarshaler); ok {
			if n.Kind != yaml.ScalarNode {
				d.decodeFailed(path, n.Line, "want a string, got %s", kindName(n))
				return
			}
			if err := u.UnmarshalText([]byte(n.Value)); err != nil {
				d.decodeFailed(path, n.Line, "%v", err)
			}
			return
		}
	}
	if v.Type() == durationType {
		d.duration(n, path, v)
		return
	}

	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		d.decode(n, path, line, v.Elem())
	case reflect.Struct:
		d.structure(n, path, v)
	case reflect.Map:
		d.mapping(n, path, v)
	case reflect.Slice:
		d.sequence(n, path, v)
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			d.decodeFailed(path, n.Line, "want a string, got %s", kindName(n))
			return
		}
		v.SetString(n.Value)
	case reflect.Bool:
		b, ok := false, n.Kind == yaml.ScalarNode && n.ShortTag() == "!!bool"
		if ok {
			ok = n.Decode(&b) == nil
		}
		if !ok {
			d.decodeFailed(path, n.Line, "want true or false, got %s", describe(n))
			return
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int64:
		var i int64
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&i) != nil || v.OverflowInt(i) {
			d.decodeFailed(path, n.Line, "want an integer, got %s", describe(n))
			return
		}
		v.SetInt(i)
	case reflect.Float64:
		var f float64
		tag := n.ShortTag()
		if n.Kind != yaml.ScalarNode || (tag != "!!int" && tag != "!!float") || n.Decode(&f) != nil {
			d.decodeFailed(path, n.Line, "want a number, got %s", describe(n))
			return
		}
		v.SetFloat(f)
	default:
		// Reaching here means a Config field has a type this walker was not
		// taught; it is a programming error, reported rather than panicking.
		d.decodeFailed(path, n.Line, "internal error: cannot decode into %s", v.Type())
	}
}

func (d *decoder) duration(n *yaml.Node, path string, v reflect.Value) {
	if n.Kind != yaml.ScalarNode {
		d.decodeFailed(path, n.Line, "want a duration such as \"250ms\", got %s", kindName(n))
		return
	}
	if n.Value == "0" {
		v.SetInt(0)
		return
	}
	dur, err := time.ParseDuration(n.Value)
	if err != nil {
		d.decodeFailed(path, n.Line, "%q is not a duration (want e.g. \"250ms\", \"30s\", \"5m\")", n.Value)
		return
	}
	v.SetInt(int64(dur))
}

func (d *decoder) structure(n *yaml.Node, path string, v reflect.Value) {
	if n.Kind != yaml.MappingNode {
		d.decodeFailed(path, n.Line, "want a mapping, got %s", kindName(n))
		return
	}
	fields := yamlFields(v.Type())
	for _, kv := range d.pairs(n, path) {
		i, ok := fields[kv.key]
		if why, retired := retiredKeys[v.Type()][kv.key]; !ok && retired {
			d.decodeFailed(joinPath(path, kv.key), kv.line, "key %q was removed: %s", kv.key, why)
			continue
		}
		if !ok {
			known := fieldNames(v.Type())
			if near := closestKey(kv.key, known); near != "" {
				d.decodeFailed(joinPath(path, kv.key), kv.line, "unknown key %q: did you mean %q?", kv.key, near)
				continue
			}
			d.decodeFailed(joinPath(path, kv.key), kv.line, "unknown key %q (known keys: %s)",
				kv.key, strings.Join(known, ", "))
			continue
		}
		d.decode(kv.value, joinPath(path, kv.key), kv.line, v.Field(i))
	}
}

func (d *decoder) mapping(n *yaml.Node, path string, v reflect.Value) {
	if n.Kind != yaml.MappingNode {
		d.decodeFailed(path, n.Line, "want a mapping, got %s", kindName(n))
		return
	}
	if v.IsNil() {
		v.Set(reflect.MakeMap(v.Type()))
	}
	for _, kv := range d.pairs(n, path) {
		elem := reflect.New(v.Type().Elem()).Elem()
		d.decode(kv.value, joinPath(path, kv.key), kv.line, elem)
		// A null entry still names the key (e.g. "policies: {chat: }"), so it
		// is kept and filled by defaults.
		if elem.Kind() == reflect.Pointer && elem.IsNil() {
			elem.Set(reflect.New(elem.Type().Elem()))
		}
		if _, seen := d.lines[joinPath(path, kv.key)]; !seen {
			d.lines[joinPath(path, kv.key)] = kv.line
		}
		v.SetMapIndex(reflect.ValueOf(kv.key).Convert(v.Type().Key()), elem)
	}
}

func (d *decoder) sequence(n *yaml.Node, path string, v reflect.Value) {
	if n.Kind != yaml.SequenceNode {
		d.decodeFailed(path, n.Line, "want a list, got %s", kindName(n))
		return
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, item := range n.Content {
		elem := s.Index(i)
		d.decode(item, indexPath(path, i), resolveAlias(item).Line, elem)
		if elem.Kind() == reflect.Pointer && elem.IsNil() {
			elem.Set(reflect.New(elem.Type().Elem()))
		}
	}
	v.Set(s)
}

type pair struct {
	key   string
	line  int
	value *yaml.Node
}

// pairs returns a mapping's entries with YAML merge keys ("<<: *anchor")
// expanded; explicit keys override merged ones. Duplicate explicit keys and
// non-string keys are reported and skipped.
func (d *decoder) pairs(n *yaml.Node, path string) []pair {
	var explicit, merged []pair
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := resolveAlias(n.Content[i]), n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			d.decodeFailed(path, k.Line, "mapping key must be a string, got %s", kindName(k))
			continue
		}
		if k.ShortTag() == "!!merge" {
			merged = append(merged, d.mergeSources(val, path)...)
			continue
		}
		if seen[k.Value] {
			d.decodeFailed(joinPath(path, k.Value), k.Line, "key %q appears more than once", k.Value)
			continue
		}
		seen[k.Value] = true
		explicit = append(explicit, pair{key: k.Value, line: k.Line, value: val})
	}
	for _, m := range merged {
		if !seen[m.key] {
			seen[m.key] = true
			explicit = append(explicit, m)
		}
	}
	return explicit
}

func (d *decoder) mergeSources(val *yaml.Node, path string) []pair {
	val = resolveAlias(val)
	switch val.Kind {
	case yaml.MappingNode:
		return d.pairs(val, path)
	case yaml.SequenceNode:
		var out []pair
		for _, item := range val.Content {
			if item = resolveAlias(item); item.Kind == yaml.MappingNode {
				out = append(out, d.pairs(item, path)...)
				continue
			}
			d.decodeFailed(path, item.Line, "merge key (<<) needs mappings, got %s", kindName(item))
		}
		return out
	}
	d.decodeFailed(path, val.Line, "merge key (<<) needs a mapping, got %s", kindName(val))
	return nil
}

func resolveAlias(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null")
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return "a scalar"
	}
	return "nothing"
}

// describe names a node for a type error: a scalar by its value, anything
// else by its kind.
func describe(n *yaml.Node) string {
	if n.Kind == yaml.ScalarNode {
		return strconv.Quote(n.Value)
	}
	return kindName(n)
}

// yamlFields maps a struct's yaml key names to field indexes.
func yamlFields(t reflect.Type) map[string]int {
	m := map[string]int{}
	for i := range t.NumField() {
		if name := yamlName(t.Field(i)); name != "" {
			m[name] = i
		}
	}
	return m
}

func fieldNames(t reflect.Type) []string {
	var names []string
	for i := range t.NumField() {
		if name := yamlName(t.Field(i)); name != "" {
			names = append(names, name)
		}
	}
	return slices.Clip(names)
}

func yamlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "-" || !f.IsExported() {
		return ""
	}
	return name
}

// The special field types must keep implementing what the decoder looks for.
var (
	_ nodeUnmarshaler = (*ByteSize)(nil)
	_ nodeUnmarshaler = (*JSONSchema)(nil)

	_ encoding.TextUnmarshaler = (*SyncInterval)(nil)
)
