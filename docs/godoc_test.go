package docs

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// publicPackages are the directories a Go program may import: their every
// exported name is documented, as go doc shows it.
var publicPackages = []string{"../pkg/config", "../pkg/limiter", "../pkg/service", "../pkg/ratelimittest", "../scripts/lua"}

func TestPublicAPIDocumented(t *testing.T) {
	for _, dir := range publicPackages {
		fset := token.NewFileSet()
		files := map[string]*ast.File{}
		matches, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range matches {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			files[path] = f
		}
		if len(files) == 0 {
			t.Errorf("%s: no Go files", dir)
			continue
		}
		var fileList []*ast.File
		for _, f := range files {
			fileList = append(fileList, f)
		}
		pkg, err := doc.NewFromFiles(fset, fileList, "example.com/"+filepath.Base(dir))
		if err != nil {
			t.Fatal(err)
		}
		missing := undocumented(pkg)
		if pkg.Doc == "" {
			missing = append(missing, "the package")
		}
		for _, name := range missing {
			t.Errorf("%s: %s has no doc comment", dir, name)
		}
	}
}

// undocumented lists pkg's exported names without a doc comment: a name in a
// documented group of constants or variables counts as documented.
func undocumented(pkg *doc.Package) []string {
	var missing []string
	values := func(vs []*doc.Value) {
		for _, v := range vs {
			if v.Doc != "" {
				continue
			}
			for _, spec := range v.Decl.Specs {
				vs := spec.(*ast.ValueSpec)
				if vs.Doc == nil && vs.Comment == nil {
					for _, n := range vs.Names {
						if n.IsExported() {
							missing = append(missing, n.Name)
						}
					}
				}
			}
		}
	}
	funcs := func(prefix string, fs []*doc.Func) {
		for _, f := range fs {
			if f.Doc == "" && ast.IsExported(f.Name) {
				missing = append(missing, prefix+f.Name)
			}
		}
	}
	values(pkg.Consts)
	values(pkg.Vars)
	funcs("", pkg.Funcs)
	for _, typ := range pkg.Types {
		if typ.Doc == "" {
			missing = append(missing, typ.Name)
		}
		values(typ.Consts)
		values(typ.Vars)
		funcs("", typ.Funcs)
		funcs(typ.Name+".", typ.Methods)
		for _, spec := range typ.Decl.Specs {
			st, ok := spec.(*ast.TypeSpec).Type.(*ast.StructType)
			if !ok {
				continue
			}
			for _, field := range st.Fields.List {
				if field.Doc != nil || field.Comment != nil {
					continue
				}
				for _, n := range field.Names {
					if n.IsExported() {
						missing = append(missing, typ.Name+"."+n.Name)
					}
				}
			}
		}
	}
	return missing
}

// TestOnlyPublicPackagesImportable: outside internal/, every package with
// Go code is a command or one of publicPackages (or proto/'s generated
// client), and scripts/lua exports no variable a user could change.
func TestOnlyPublicPackagesImportable(t *testing.T) {
	allowed := map[string]bool{}
	for _, dir := range publicPackages {
		allowed[filepath.Clean(dir)] = true
	}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		switch d.Name() {
		case "internal", "testdata", ".git", "node_modules":
			return filepath.SkipDir
		}
		if path == filepath.Join("..", "proto") {
			return filepath.SkipDir // generated code, checked by proto's own test
		}
		matches, err := filepath.Glob(filepath.Join(path, "*.go"))
		if err != nil {
			return err
		}
		for _, m := range matches {
			if strings.HasSuffix(m, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), m, nil, parser.PackageClauseOnly)
			if err != nil {
				return err
			}
			if f.Name.Name != "main" && !allowed[path] {
				t.Errorf("%s: package %s is importable, but is not one of the public packages: move it under internal/", path, f.Name.Name)
			}
			break
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	fset := token.NewFileSet()
	var files []*ast.File
	matches, _ := filepath.Glob("../scripts/lua/*.go")
	for _, m := range matches {
		if strings.HasSuffix(m, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, m, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	pkg, err := doc.NewFromFiles(fset, files, "example.com/lua")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range pkg.Vars {
		for _, spec := range v.Decl.Specs {
			t.Errorf("scripts/lua exports the variable %v: a user could change it", spec.(*ast.ValueSpec).Names)
		}
	}
}
