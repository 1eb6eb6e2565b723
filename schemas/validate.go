package schemas

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"net/url"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Kinds of message and record, each defined by the schema file
// <kind>.schema.json in this package.
const (
	KindChatRequest      = "chat_request"
	KindAttempt          = "attempt"
	KindAccept           = "accept"
	KindBusy             = "busy"
	KindHeartbeat        = "heartbeat"
	KindFirstByte        = "first_byte"
	KindChunk            = "chunk"
	KindAttemptResult    = "attempt_result"
	KindCancel           = "cancel"
	KindSubmitRequest    = "submit_request"
	KindSubmitResponse   = "submit_response"
	KindSubmitChunk      = "submit_chunk"
	KindAttemptRecord    = "attempt_record"
	KindGroupRecord      = "group_record"
	KindSupersededRecord = "superseded_record"
)

// Kinds lists every kind Validate knows, in a fixed order.
func Kinds() []string {
	return []string{
		KindChatRequest, KindAttempt, KindAccept, KindBusy, KindHeartbeat, KindFirstByte,
		KindChunk, KindAttemptResult, KindCancel, KindSubmitRequest, KindSubmitResponse,
		KindSubmitChunk, KindAttemptRecord, KindGroupRecord, KindSupersededRecord,
	}
}

// Kind names the request's schema. A ChatRequest travels inside Attempt and
// SubmitRequest, which carry the version; it has no "v" of its own.
func (ChatRequest) Kind() string { return KindChatRequest }

// Files holds the JSON Schema files (draft 2020-12): one <kind>.schema.json
// per kind plus defs.schema.json, the definitions they share.
//
//go:embed *.schema.json
var Files embed.FS

// schemaScheme is the URL scheme under which the embedded files are compiled;
// the files refer to each other by relative reference, so they resolve the
// same way from this FS as from a directory on disk.
const schemaScheme = "hedgerow-schema"

// compiled holds one lazily compiled schema per kind. Each kind compiles
// once, with a compiler of its own, because a jsonschema.Compiler is not
// safe for concurrent use.
var compiled = func() map[string]*lazySchema {
	m := make(map[string]*lazySchema)
	for _, k := range Kinds() {
		m[k] = &lazySchema{kind: k}
	}
	return m
}()

type lazySchema struct {
	kind string
	once sync.Once
	sch  *jsonschema.Schema
	err  error
}

func (l *lazySchema) get() (*jsonschema.Schema, error) {
	l.once.Do(func() {
		c := jsonschema.NewCompiler()
		c.DefaultDraft(jsonschema.Draft2020)
		c.AssertFormat()
		c.UseLoader(jsonschema.SchemeURLLoader{schemaScheme: embedLoader{}})
		l.sch, l.err = c.Compile(schemaScheme + ":///" + l.kind + ".schema.json")
		if l.err != nil {
			l.err = fmt.Errorf("compile %s schema: %w", l.kind, l.err)
		}
	})
	return l.sch, l.err
}

// embedLoader serves the embedded schema files to the compiler.
type embedLoader struct{}

func (embedLoader) Load(rawURL string) (any, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	data, err := fs.ReadFile(Files, strings.TrimPrefix(u.Path, "/"))
	if err != nil {
		return nil, err
	}
	return jsonschema.UnmarshalJSON(bytes.NewReader(data))
}

// Validate checks data, one JSON document, against the schema of kind. The
// schemas are strict (no unknown properties, "v" must be Version), so this
// is the check for producers and tests; readers use Decode, which tolerates
// additive fields. A *jsonschema.ValidationError is wrapped in the error.
func Validate(kind string, data []byte) error {
	l, ok := compiled[kind]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownKind, kind)
	}
	sch, err := l.get()
	if err != nil {
		return err
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("validate %s: %w", kind, err)
	}
	if err := sch.Validate(doc); err != nil {
		return fmt.Errorf("validate %s: %w", kind, err)
	}
	return nil
}
