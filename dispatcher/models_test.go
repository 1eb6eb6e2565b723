package dispatcher

import (
	"errors"
	"slices"
	"testing"

	"github.com/hedgerow/hedgerow/schemas"
)

func TestModelNamesResolveAliasesToTheirPoolAndListPoolsFirst(t *testing.T) {
	index, listing, err := modelNames(map[string]Pool{
		"general": {Models: []string{"gpt-4o", "gpt-4o-mini"}},
		"claude":  {Models: []string{"claude-3.5-sonnet"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []Model{{"claude", "claude"}, {"claude-3.5-sonnet", "claude"}, {"general", "general"}, {"gpt-4o", "general"}, {"gpt-4o-mini", "general"}}
	if !slices.Equal(listing, want) {
		t.Fatalf("listing %v, want %v", listing, want)
	}
	if index["gpt-4o"] != "general" || index["general"] != "general" || index["claude-3.5-sonnet"] != "claude" {
		t.Fatalf("index %v", index)
	}
}

func TestModelNamesRefuseANameOfTwoPoolsOrNoName(t *testing.T) {
	if _, _, err := modelNames(map[string]Pool{"a": {Models: []string{"b"}}, "b": {}}); err == nil {
		t.Fatal("an alias equal to another pool's name was accepted")
	}
	if _, _, err := modelNames(map[string]Pool{"a": {Models: []string{"m"}}, "b": {Models: []string{"m"}}}); err == nil {
		t.Fatal("one alias of two pools was accepted")
	}
	if _, _, err := modelNames(map[string]Pool{"a": {Models: []string{"bad\nname"}}}); !errors.Is(err, schemas.ErrInvalidModelName) {
		t.Fatalf("a name with a control character: %v, want ErrInvalidModelName", err)
	}
}
