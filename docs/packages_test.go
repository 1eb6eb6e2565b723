// Package docs holds hedgerow's design document, docs/architecture.md; its
// tests check that the package map of its §3 and the README's folder table
// name every package of the repository and no folder that is gone, and
// that the README documents the headers every answer carries.
package docs

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	pathpkg "path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestEveryPackageIsInSection3 fails naming each package of the repository
// that the package table of docs/architecture.md §3 does not list in its
// first column, and each folder that table lists that does not exist.
func TestEveryPackageIsInSection3(t *testing.T) {
	checkTable(t, "architecture.md", "| package | responsibility |")
}

// TestEveryPackageIsInTheREADMEsFolders is the same check on the README's
// folder table.
func TestEveryPackageIsInTheREADMEsFolders(t *testing.T) {
	checkTable(t, "../README.md", "| folder | what lives there |")
}

// checkTable compares the packages of the repository with the names the
// first column of the table under header in file lists.
func checkTable(t *testing.T, file, header string) {
	t.Helper()
	listed := tableNames(t, file, header)
	pkgs := packages(t)
	if len(pkgs) == 0 {
		t.Fatal("found no packages: is the walk at the repository root?")
	}
	for _, p := range pkgs {
		if !slices.Contains(listed, p) {
			t.Errorf("package %s is missing from the table of %s", p, file)
		}
	}
	for _, name := range listed {
		if _, err := os.Stat(filepath.Join("..", filepath.FromSlash(name))); err != nil {
			t.Errorf("the table of %s names %s, which does not exist", file, name)
		}
	}
}

// packages lists the folder of every package of the repository, relative
// to its root: each folder holding a .go file, test-only packages (deploy,
// scripts, docs) included, and none the go command ignores (testdata,
// names starting with . or _).
func packages(t *testing.T) []string {
	t.Helper()
	var pkgs []string
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != ".." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		dir := filepath.ToSlash(filepath.Dir(strings.TrimPrefix(path, ".."+string(filepath.Separator))))
		if !slices.Contains(pkgs, dir) {
			pkgs = append(pkgs, dir)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

// cell splits a table row on the bars that are not escaped (`up\|down`).
var cell = regexp.MustCompile(`(^|[^\\])\|`)

// code matches a name in backquotes.
var code = regexp.MustCompile("`([^`]+)`")

// tableNames returns the names in backquotes of the first column of the
// table whose header line is header, in the order the rows give them.
func tableNames(t *testing.T, file, header string) []string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	in := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == header:
			in = true
			continue
		case !in:
			continue
		case !strings.HasPrefix(line, "|"):
			in = false
			continue
		}
		cols := cell.Split(line, 3)
		if len(cols) < 3 || strings.HasPrefix(cols[1], "-") {
			continue // the separator row
		}
		for _, m := range code.FindAllStringSubmatch(cols[1], -1) {
			names = append(names, m[1])
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Fatalf("%s has no table under %q", file, header)
	}
	return names
}

// TestNoPublicPackageExposesAnInternalType fails naming each exported
// declaration of a public package (one outside internal/, cmd/ and
// integration/; test helpers included) whose written type mentions a type
// of an internal/ package: a function's or method's parameters and
// results, a type's definition (an alias, an exported field or embedding,
// an interface's methods), a variable's or constant's declared type. Their
// tests may use internal/ packages freely, and so may unexported code.
func TestNoPublicPackageExposesAnInternalType(t *testing.T) {
	for _, dir := range packages(t) {
		if dir == "internal" || dir == "cmd" || dir == "integration" ||
			strings.HasPrefix(dir, "internal/") || strings.HasPrefix(dir, "cmd/") || strings.HasPrefix(dir, "integration/") {
			continue
		}
		files, err := filepath.Glob(filepath.Join("..", filepath.FromSlash(dir), "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		fset := token.NewFileSet()
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			for _, bad := range exposedInternals(f) {
				t.Errorf("%s: %s exposes %s, a type of an internal/ package", fset.Position(bad.pos), bad.decl, bad.ref)
			}
		}
	}
}

// exposure is one exported declaration that mentions an internal/ type.
type exposure struct {
	pos       token.Pos
	decl, ref string
}

// exposedInternals returns the exported declarations of f whose types
// mention a name of a package f imports from internal/.
func exposedInternals(f *ast.File) []exposure {
	internal := map[string]bool{} // the names f gives its internal/ imports
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		if !strings.Contains(path, "/internal/") {
			continue
		}
		name := pathpkg.Base(path)
		if imp.Name != nil {
			name = imp.Name.Name
		}
		internal[name] = true
	}
	if len(internal) == 0 {
		return nil
	}
	var found []exposure
	var check func(decl string, exprs ...ast.Expr)
	check = func(decl string, exprs ...ast.Expr) {
		for _, e := range exprs {
			if e == nil {
				continue
			}
			ast.Inspect(e, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.StructType:
					for _, field := range n.Fields.List {
						if exportedField(field) {
							check(decl, field.Type)
						}
					}
					return false
				case *ast.SelectorExpr:
					if x, ok := n.X.(*ast.Ident); ok && internal[x.Name] {
						found = append(found, exposure{n.Pos(), decl, x.Name + "." + n.Sel.Name})
					}
				}
				return true
			})
		}
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() || (d.Recv != nil && !exportedReceiver(d.Recv)) {
				continue
			}
			check(d.Name.Name, d.Type)
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch spec := spec.(type) {
				case *ast.TypeSpec:
					if spec.Name.IsExported() {
						check(spec.Name.Name, spec.Type)
						if spec.TypeParams != nil {
							for _, p := range spec.TypeParams.List {
								check(spec.Name.Name, p.Type)
							}
						}
					}
				case *ast.ValueSpec:
					for _, n := range spec.Names {
						if n.IsExported() {
							check(n.Name, spec.Type)
						}
					}
				}
			}
		}
	}
	return found
}

// exportedField says whether a struct field is part of its type's API: a
// named field with an exported name, or an embedding of an exported type.
func exportedField(field *ast.Field) bool {
	if len(field.Names) == 0 {
		t := field.Type
		if star, ok := t.(*ast.StarExpr); ok {
			t = star.X
		}
		switch t := t.(type) {
		case *ast.Ident:
			return t.IsExported()
		case *ast.SelectorExpr:
			return t.Sel.IsExported()
		}
		return false
	}
	for _, n := range field.Names {
		if n.IsExported() {
			return true
		}
	}
	return false
}

// exportedReceiver says whether a method's receiver type is exported.
func exportedReceiver(recv *ast.FieldList) bool {
	t := recv.List[0].Type
	if star, ok := t.(*ast.StarExpr); ok {
		t = star.X
	}
	switch t := t.(type) {
	case *ast.IndexExpr:
		t2, _ := t.X.(*ast.Ident)
		return t2 != nil && t2.IsExported()
	case *ast.IndexListExpr:
		t2, _ := t.X.(*ast.Ident)
		return t2 != nil && t2.IsExported()
	case *ast.Ident:
		return t.IsExported()
	}
	return false
}
