// Package scripts holds the repository's scripts; its test checks that
// scripts/fuzz-targets, the list `make fuzz` runs, names every fuzz target.
package scripts

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// fuzzFunc matches the declaration of a go test fuzz target.
var fuzzFunc = regexp.MustCompile(`(?m)^func (Fuzz\w*)\(\w+ \*testing\.F\)`)

// TestEveryFuzzTargetIsListed fails when a Fuzz function of some package is
// not in scripts/fuzz-targets (make fuzz would never run it), or when the
// list names a target that does not exist there.
func TestEveryFuzzTargetIsListed(t *testing.T) {
	listed := listedTargets(t)
	var found []string
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") && path != ".." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		pkg := "./" + filepath.ToSlash(filepath.Dir(strings.TrimPrefix(path, "../")))
		for _, m := range fuzzFunc.FindAllSubmatch(src, -1) {
			found = append(found, pkg+" "+string(m[1]))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) == 0 {
		t.Fatal("found no fuzz targets: is the walk at the repository root?")
	}
	for _, f := range found {
		if !slices.Contains(listed, f) {
			t.Errorf("fuzz target %s is not in scripts/fuzz-targets: make fuzz never runs it", f)
		}
	}
	for _, l := range listed {
		if !slices.Contains(found, l) {
			t.Errorf("scripts/fuzz-targets names %s, which does not exist", l)
		}
	}
}

// listedTargets reads scripts/fuzz-targets as "package target" pairs.
func listedTargets(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("fuzz-targets")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var listed []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		if len(fields) != 3 {
			t.Fatalf("scripts/fuzz-targets line %q: want package, target and group", sc.Text())
		}
		listed = append(listed, fields[0]+" "+fields[1])
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return listed
}
