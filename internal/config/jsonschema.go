package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"
)

func (s *JSONSchema) unmarshalNode(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Value == "" {
			return fmt.Errorf("want a schema file path or an inline schema, got an empty string")
		}
		s.Source = n.Value
		return nil
	case yaml.MappingNode:
		var doc any
		if err := n.Decode(&doc); err != nil {
			return fmt.Errorf("inline schema: %w", err)
		}
		b, err := json.Marshal(doc)
		if err != nil {
			return fmt.Errorf("inline schema is not expressible as JSON: %w", err)
		}
		s.Document = b
		return nil
	}
	return fmt.Errorf("want a schema file path or an inline schema mapping, got %s", kindName(n))
}

// resolve reads a schema given as a file path, relative paths being taken
// from dir, and checks that the schema compiles. name locates an inline
// schema in the compiler's error messages.
func (s *JSONSchema) resolve(dir, name string) error {
	if s.IsZero() {
		return nil
	}
	// An inline schema gets a made-up location; a file keeps its own, so
	// that relative $refs in it resolve next to it.
	loc := "file:///hedgerow-config/" + name + ".json"
	if s.Source != "" {
		if !filepath.IsAbs(s.Source) {
			s.Source = filepath.Join(dir, s.Source)
		}
		if abs, err := filepath.Abs(s.Source); err == nil {
			loc = "file://" + filepath.ToSlash(abs)
		}
		b, err := os.ReadFile(s.Source)
		if err != nil {
			return fmt.Errorf("read schema: %w", err)
		}
		s.Document = b
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(s.Document))
	if err != nil {
		return fmt.Errorf("schema is not valid JSON: %w", err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource(loc, doc); err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	if _, err := c.Compile(loc); err != nil {
		return fmt.Errorf("schema does not compile: %w", err)
	}
	return nil
}
