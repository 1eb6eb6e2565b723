package schemas

import (
	"encoding/json"
	"testing"
)

func TestHasToolCallsCountsOnlyANonEmptyArray(t *testing.T) {
	for raw, want := range map[string]bool{
		"":                  false,
		"null":              false,
		" null ":            false,
		"[]":                false,
		"\n[]\t":            false,
		`[{"index":0}]`:     true,
		` [{"id":"call"}] `: true,
	} {
		if got := HasToolCalls(json.RawMessage(raw)); got != want {
			t.Errorf("HasToolCalls(%q) = %v, want %v", raw, got, want)
		}
	}
}
