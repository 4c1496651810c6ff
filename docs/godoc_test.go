package docs

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
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
