package schemas

import (
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %T: %v", v, err)
	}
	return b
}

// toMap decodes an encoded sample into a generic object for mutation.
func toMap(t *testing.T, data []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("unmarshal: %v", err)
	}
	return m
}

// versioned reports whether kind's messages carry "v" at top level.
func versioned(kind string) bool { return kind != KindChatRequest }

// schemaDoc reads one embedded schema file as a generic object.
func schemaDoc(t *testing.T, name string) map[string]any {
	t.Helper()
	data, err := fs.ReadFile(Files, name)
	if err != nil {
		t.Fatalf("read %s: %v", name, err)
	}
	return toMap(t, data)
}

func TestEverySampleValidatesAgainstItsSchema(t *testing.T) {
	for _, s := range samples() {
		for name, v := range map[string]kinded{"minimal": s.minimal, "full": s.full} {
			t.Run(s.kind+"/"+name, func(t *testing.T) {
				if v.Kind() != s.kind {
					t.Fatalf("sample of %T has Kind() %q, listed under %q", v, v.Kind(), s.kind)
				}
				data := mustMarshal(t, v)
				if err := Validate(s.kind, data); err != nil {
					t.Fatalf("%s\n%v", data, err)
				}
			})
		}
	}
}

func TestEveryKindHasASchemaFileAndASample(t *testing.T) {
	files, err := fs.Glob(Files, "*.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var fileKinds []string
	for _, f := range files {
		if k := strings.TrimSuffix(f, ".schema.json"); k != "defs" {
			fileKinds = append(fileKinds, k)
		}
	}
	var sampleKinds []string
	for _, s := range samples() {
		sampleKinds = append(sampleKinds, s.kind)
	}
	kinds := Kinds()
	sort.Strings(fileKinds)
	sort.Strings(sampleKinds)
	sort.Strings(kinds)
	if !slices.Equal(kinds, fileKinds) {
		t.Errorf("Kinds() = %v, schema files define %v", kinds, fileKinds)
	}
	if !slices.Equal(kinds, sampleKinds) {
		t.Errorf("Kinds() = %v, samples cover %v", kinds, sampleKinds)
	}
}

// packageFiles parses the package's non-test Go files.
func packageFiles(t *testing.T) []*ast.File {
	t.Helper()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

func TestEveryVersionedTypeHasASample(t *testing.T) {
	sampled := map[string]bool{}
	for _, s := range samples() {
		sampled[reflect.TypeOf(s.full).Name()] = true
	}
	found := 0
	for _, f := range packageFiles(t) {
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok || !ts.Name.IsExported() {
				return true
			}
			for _, field := range st.Fields.List {
				if field.Tag != nil && strings.Contains(field.Tag.Value, `json:"v"`) {
					found++
					if !sampled[ts.Name.Name] {
						t.Errorf("type %s carries a version but has no sample (and so maybe no schema)", ts.Name.Name)
					}
				}
			}
			return true
		})
	}
	if found != len(Kinds())-1 { // every kind but chat_request is versioned
		t.Errorf("found %d versioned types, want %d", found, len(Kinds())-1)
	}
}

func TestSchemaEnumsMatchGoConstants(t *testing.T) {
	defsOf := map[string]string{
		"Role": "role", "MessageRole": "message_role", "ErrorScope": "error_scope",
		"StatusClass": "status_class", "ErrorCode": "error_code", "CancelReason": "cancel_reason",
		"Outcome": "outcome", "GroupOutcome": "group_outcome", "CostBand": "cost_band",
		"GuardrailDecision": "guardrail_decision", "Reporter": "reporter",
	}
	consts := map[string][]string{}
	for _, f := range packageFiles(t) {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				typ, ok := vs.Type.(*ast.Ident)
				if !ok {
					continue
				}
				for _, val := range vs.Values {
					if lit, ok := val.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						s, _ := strconv.Unquote(lit.Value)
						consts[typ.Name] = append(consts[typ.Name], s)
					}
				}
			}
		}
	}
	defs := schemaDoc(t, "defs.schema.json")["$defs"].(map[string]any)
	for goType, def := range defsOf {
		t.Run(goType, func(t *testing.T) {
			d, ok := defs[def].(map[string]any)
			if !ok {
				t.Fatalf("defs.schema.json has no $defs/%s", def)
			}
			var enum []string
			for _, v := range d["enum"].([]any) {
				enum = append(enum, v.(string))
			}
			got := slices.Clone(consts[goType])
			sort.Strings(got)
			sort.Strings(enum)
			if len(got) == 0 || !slices.Equal(got, enum) {
				t.Errorf("Go constants of %s = %v, schema enum %s = %v", goType, got, def, enum)
			}
		})
	}
	t.Run("ReplyType", func(t *testing.T) {
		var types []string
		for _, k := range []string{KindAccept, KindBusy, KindHeartbeat, KindFirstByte, KindChunk, KindAttemptResult} {
			props := schemaDoc(t, k+".schema.json")["properties"].(map[string]any)
			types = append(types, props["type"].(map[string]any)["const"].(string))
		}
		got := slices.Clone(consts["ReplyType"])
		sort.Strings(got)
		sort.Strings(types)
		if !slices.Equal(got, types) {
			t.Errorf("ReplyType constants %v, reply schemas' type consts %v", got, types)
		}
	})
}

func TestUnknownMajorVersionIsRejectedBySchemaAndDecode(t *testing.T) {
	for _, s := range samples() {
		if !versioned(s.kind) {
			continue
		}
		for _, v := range []any{2, 0, nil, "1", 1.5} {
			t.Run(s.kind+"/v="+string(mustMarshal(t, v)), func(t *testing.T) {
				m := toMap(t, mustMarshal(t, s.full))
				if v == nil {
					delete(m, "v")
				} else {
					m["v"] = v
				}
				data := mustMarshal(t, m)
				if err := Validate(s.kind, data); err == nil {
					t.Errorf("schema accepted %s", data)
				}
				target := reflect.New(reflect.TypeOf(s.full)).Interface()
				err := Decode(data, target)
				if !errors.Is(err, ErrUnsupportedVersion) {
					t.Errorf("Decode error = %v, want ErrUnsupportedVersion", err)
				}
			})
		}
	}
}

func TestDecodeReportsTheVersionSeen(t *testing.T) {
	err := Decode([]byte(`{"v":2,"group_id":"g"}`), new(Cancel))
	var ve *VersionError
	if !errors.As(err, &ve) || ve.Seen != 2 {
		t.Fatalf("Decode error = %v, want *VersionError{Seen: 2}", err)
	}
	if !strings.Contains(err.Error(), "v=2") {
		t.Errorf("error %q does not name the version", err)
	}
}

func TestMissingRequiredFieldIsRejected(t *testing.T) {
	for _, s := range samples() {
		doc := schemaDoc(t, s.kind+".schema.json")
		required, _ := doc["required"].([]any)
		if alts, ok := doc["oneOf"].([]any); ok && required == nil {
			// A request is a chat request or an embeddings request: the
			// sample is the first alternative.
			required, _ = alts[0].(map[string]any)["required"].([]any)
		}
		if len(required) == 0 {
			t.Fatalf("%s schema lists no required fields", s.kind)
		}
		for _, r := range required {
			field := r.(string)
			t.Run(s.kind+"/"+field, func(t *testing.T) {
				m := toMap(t, mustMarshal(t, s.full))
				if _, ok := m[field]; !ok {
					t.Fatalf("full sample lacks required field %q", field)
				}
				delete(m, field)
				if err := Validate(s.kind, mustMarshal(t, m)); err == nil {
					t.Errorf("schema accepted %s without %q", s.kind, field)
				}
			})
		}
	}
}

func TestExtraPropertyIsRejected(t *testing.T) {
	for _, s := range samples() {
		t.Run(s.kind, func(t *testing.T) {
			m := toMap(t, mustMarshal(t, s.full))
			m["prompt"] = "leaked text"
			if err := Validate(s.kind, mustMarshal(t, m)); err == nil {
				t.Errorf("schema accepted an extra property on %s", s.kind)
			}
		})
	}
}

func TestDecodeRoundTripsEverySample(t *testing.T) {
	for _, s := range samples() {
		if !versioned(s.kind) {
			continue
		}
		t.Run(s.kind, func(t *testing.T) {
			want := reflect.ValueOf(s.full)
			got := reflect.New(want.Type())
			if err := Decode(mustMarshal(t, s.full), got.Interface()); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.Elem().Interface(), s.full) {
				t.Errorf("round trip\n got %+v\nwant %+v", got.Elem().Interface(), s.full)
			}
		})
	}
}

func TestDecodeIgnoresFieldsAddedWithinTheSameMajorVersion(t *testing.T) {
	var c Cancel
	err := Decode([]byte(`{"v":1,"group_id":"g","attempt":2,"reason":"deadline","added_later":true}`), &c)
	if err != nil {
		t.Fatal(err)
	}
	if c != (Cancel{V: 1, GroupID: "g", Attempt: 2, Reason: CancelDeadline}) {
		t.Errorf("decoded %+v", c)
	}
}

func TestMarshalStampsTheVersionWhenUnset(t *testing.T) {
	for _, s := range samples() {
		if !versioned(s.kind) {
			continue
		}
		t.Run(s.kind, func(t *testing.T) {
			m := toMap(t, mustMarshal(t, s.minimal))
			if m["v"] != float64(Version) {
				t.Errorf("v = %v, want %d", m["v"], Version)
			}
		})
	}
}

func TestDecodeReplyDispatchesOnType(t *testing.T) {
	for _, s := range samples() {
		want, ok := reflect.New(reflect.TypeOf(s.full)).Interface().(Reply)
		if !ok {
			continue
		}
		t.Run(s.kind, func(t *testing.T) {
			r, err := DecodeReply(mustMarshal(t, s.full))
			if err != nil {
				t.Fatal(err)
			}
			if reflect.TypeOf(r) != reflect.TypeOf(want) || r.ReplyType() != want.ReplyType() {
				t.Fatalf("decoded %T (%s), want %T", r, r.ReplyType(), want)
			}
			if !reflect.DeepEqual(reflect.ValueOf(r).Elem().Interface(), s.full) {
				t.Errorf("decoded %+v, want %+v", r, s.full)
			}
			if g, a := r.AttemptRef(); g != "hg_042" || a != 2 {
				t.Errorf("AttemptRef = %s/%d", g, a)
			}
		})
	}
}

func TestDecodeReplyRejectsUnknownTypeAndVersion(t *testing.T) {
	for name, tc := range map[string]struct {
		data        string
		wantVersion bool
	}{
		"unknown type": {`{"v":1,"type":"gossip","group_id":"g","attempt":1}`, false},
		"missing type": {`{"v":1,"group_id":"g","attempt":1}`, false},
		"version 2":    {`{"v":2,"type":"chunk","group_id":"g","attempt":1,"seq":1}`, true},
		"not json":     {`{"v":1,`, false},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeReply([]byte(tc.data))
			if err == nil {
				t.Fatal("DecodeReply accepted it")
			}
			if got := errors.Is(err, ErrUnsupportedVersion); got != tc.wantVersion {
				t.Errorf("errors.Is(%v, ErrUnsupportedVersion) = %v, want %v", err, got, tc.wantVersion)
			}
		})
	}
}

func TestCommitPointRoundTripsThroughJSON(t *testing.T) {
	for _, cp := range []CommitPoint{FirstToken, Complete, {Kind: CommitTokens, Tokens: 1}, {Kind: CommitTokens, Tokens: 64}} {
		t.Run(cp.String(), func(t *testing.T) {
			a := samples()[1].full.(Attempt)
			a.CommitPoint = cp
			data := mustMarshal(t, a)
			if err := Validate(KindAttempt, data); err != nil {
				t.Fatal(err)
			}
			var got Attempt
			if err := Decode(data, &got); err != nil {
				t.Fatal(err)
			}
			if got.CommitPoint != cp {
				t.Errorf("got %v, want %v", got.CommitPoint, cp)
			}
		})
	}
	for _, bad := range []string{"tokens:0", "tokens:x", "first", ""} {
		t.Run("rejects "+bad, func(t *testing.T) {
			m := toMap(t, mustMarshal(t, samples()[1].full))
			m["commit_point"] = bad
			data := mustMarshal(t, m)
			if err := Validate(KindAttempt, data); err == nil {
				t.Error("schema accepted it")
			}
			if err := Decode(data, new(Attempt)); err == nil {
				t.Error("Decode accepted it")
			}
		})
	}
}

func TestValidateRejectsUnknownKindAndInvalidJSON(t *testing.T) {
	if err := Validate("gossip", []byte(`{}`)); !errors.Is(err, ErrUnknownKind) {
		t.Errorf("unknown kind: err = %v, want ErrUnknownKind", err)
	}
	if err := Validate(KindCancel, []byte(`{"v":1,`)); err == nil {
		t.Error("invalid JSON accepted")
	}
}

func TestValidateIsSafeForConcurrentFirstUse(t *testing.T) {
	var wg sync.WaitGroup
	errs := make(chan error, 16*len(samples()))
	for range 16 {
		for _, s := range samples() {
			data := mustMarshal(t, s.full)
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- Validate(s.kind, data)
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

func TestRecordsHaveNoFieldForPromptOutputOrCredentials(t *testing.T) {
	forbidden := []string{"prompt", "content", "message", "output", "header", "authorization", "api_key",
		"credential", "token", "idempotency", "tenant", "user", "text"}
	allowed := map[string]bool{"prompt_fingerprint": true, "user_action_id": true, "usage_output_units": true}
	for _, v := range []any{AttemptRecord{}, GroupRecord{}, SupersededRecord{}} {
		typ := reflect.TypeOf(v)
		for i := range typ.NumField() {
			name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
			if allowed[name] {
				continue
			}
			for _, f := range forbidden {
				if strings.Contains(name, f) {
					t.Errorf("%s.%s (%q) looks like it could carry %s", typ.Name(), typ.Field(i).Name, name, f)
				}
			}
		}
	}
}

func TestCostBandWeighsOutputFourTimes(t *testing.T) {
	for _, tc := range []struct {
		u    Usage
		want CostBand
	}{
		{Usage{}, CostLow},
		{Usage{InputUnits: 750, OutputUnits: 150}, CostLow},
		{Usage{InputUnits: 0, OutputUnits: CostMediumFrom / 4}, CostMedium},
		{Usage{InputUnits: CostMediumFrom - 1}, CostLow},
		{Usage{InputUnits: CostHighFrom - 4, OutputUnits: 1}, CostHigh},
	} {
		if got := CostBandOf(tc.u); got != tc.want {
			t.Errorf("CostBandOf(%+v) = %s, want %s", tc.u, got, tc.want)
		}
	}
}
