package lua

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	glua "github.com/yuin/gopher-lua"
	"github.com/yuin/gopher-lua/ast"
	"github.com/yuin/gopher-lua/parse"

	"github.com/slidingwindow/ratelimit/internal/algorithm"
)

// TestAlgorithmTable checks internal/algorithm's table against the Lua:
// each algorithm's source is its Name.lua, and
// every Lua file is an algorithm's or one of the shared ones.
// internal/algorithm's TestTable checks the table itself (IDs 1, 2, ... in
// order, names and key codes distinct, ByID).
func TestAlgorithmTable(t *testing.T) {
	names := map[string]bool{}
	all := algorithm.All()
	if len(sources) != len(all) {
		t.Fatalf("%d sources for %d algorithms", len(sources), len(all))
	}
	for i, a := range all {
		if a.ID != i+1 {
			t.Errorf("%s has ID %d at index %d: want index + 1", a.Name, a.ID, i)
		}
		names[a.Name] = true
		file, err := os.ReadFile(a.Name + ".lua")
		if err != nil || string(file) != sources[i] {
			t.Errorf("%s: the source is not %s.lua (%v)", a.Name, a.Name, err)
		}
	}
	// Every Lua file is an algorithm's or one of the shared ones.
	files, err := filepath.Glob("*.lua")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if name := strings.TrimSuffix(f, ".lua"); !names[name] && !slices.Contains([]string{"prelude", "decide", "refund", "reset", "rlqs_lease", "rlqs_shares", "rlqs_confirm", "region_allowance", "region_sync", "water_level"}, name) {
			t.Errorf("%s is neither an algorithm's file (no entry in internal/algorithm's table) nor a shared one", f)
		}
	}
}

// TestScripts: each exported function returns the script assembled here,
// and every script and name is set.
func TestScripts(t *testing.T) {
	for name, got := range map[string]string{
		"Constants": Constants(), "Decide": Decide(), "DecideFunction": DecideFunction(), "RefundFunction": RefundFunction(), "Library": Library(),
		"Refund": Refund(), "Reset": Reset(), "RLQSShares": RLQSShares(), "RLQSConfirm": RLQSConfirm(), "RegionAllowance": RegionAllowance(), "RegionSync": RegionSync(),
	} {
		if got == "" {
			t.Errorf("%s() is empty", name)
		}
	}
	if Constants() != constants || Decide() != decideScript || Library() != functionLibrary || Refund() != refundScript ||
		Reset() != reset || RLQSShares() != rlqsShares || RLQSConfirm() != rlqsConfirm || RegionAllowance() != regionAllowance || RegionSync() != regionSync || DecideFunction() != decideFunction || RefundFunction() != refundFunction {
		t.Error("an exported function does not return its script")
	}
	if !strings.HasPrefix(Library(), "#!lua name=ratelimit_"+version+"\n") ||
		!strings.HasSuffix(Library(), "redis.register_function('"+DecideFunction()+"', decide)\n"+
			"redis.register_function('"+RefundFunction()+"', undo_charges)\n") {
		t.Errorf("Library does not register DecideFunction %q and RefundFunction %q", DecideFunction(), RefundFunction())
	}
}

// TestLuaConstants runs the assembled code and reads back, from the Lua,
// what is shared with Go: each operation's entry of OPS as Ops has it, the
// roles' letters, each algorithm's ID, and that decide.lua's algorithms
// table holds each algorithm's own table at its ID.
func TestLuaConstants(t *testing.T) {
	seen := map[byte]bool{}
	for _, o := range Ops() {
		if seen[o.Letter] || OpOf(o.Letter) != o {
			t.Errorf("op %q: its letter names another kind too, or OpOf does not find it", o.Name)
		}
		seen[o.Letter] = true
		got := runLua(t, library+fmt.Sprintf(`local k = OPS[%q]
			return k.name, k.charges, k.record, k.conditional, k.applied_first, k.lease, k.settle`, string(o.Letter)), 7)
		want := []string{o.Name, fmt.Sprint(o.Charges), fmt.Sprint(o.Record), fmt.Sprint(o.Conditional), fmt.Sprint(o.AppliedFirst),
			fmt.Sprint(o.Lease), fmt.Sprint(o.Settle)}
		if !slices.Equal(got, want) {
			t.Errorf("OPS[%q] is %q, Ops has %q", o.Letter, got, want)
		}
	}
	got := runLua(t, library+`return ROLE_ENFORCED, ROLE_SHADOW, ROLE_QUOTA, ROLE_QUOTA_OVER, FLEET_SUFFIX`, 5)
	if want := []string{"e", "s", "q", "o", FleetSuffix}; !slices.Equal(got, want) {
		t.Errorf("the Lua's roles are %q, want %q", got, want)
	}
	all := algorithm.All()
	for _, a := range all {
		c := luaConstant(&a)
		got := runLua(t, library+fmt.Sprintf("return %s, algorithms[%s] == %s, #algorithms", c, c, a.Name), 3)
		if want := []string{fmt.Sprint(a.ID), "true", fmt.Sprint(len(all))}; !slices.Equal(got, want) {
			t.Errorf("%s: the Lua says %s, algorithms[%s] == %s, #algorithms = %q; want %q", a.Name, c, c, a.Name, got, want)
		}
	}
}

// runLua runs code in a plain Lua state and returns its n results as strings.
func runLua(t *testing.T, code string, n int) []string {
	t.Helper()
	L := glua.NewState()
	defer L.Close()
	if err := L.DoString(code); err != nil {
		t.Fatal(err)
	}
	out := make([]string, n)
	for i := range n {
		out[i] = L.Get(i - n).String()
	}
	return out
}

// redisGlobals are the globals Redis gives Lua code that this code uses.
var redisGlobals = []string{"redis", "math", "string", "table", "tonumber", "tostring", "type", "pairs", "ipairs",
	"unpack", "error", "select", "next", "KEYS", "ARGV"}

// TestLibraryOrder: the files share locals only because they are
// concatenated in order (see library). Checked here, file by file in that
// order, with the top-level locals of the files before it in scope: every
// name a file reads or assigns is a local declared before, or a global Redis
// gives; an algorithm's file never uses another algorithm's table (so their
// order among themselves does not matter), defines its table and every
// function decide.lua and refund.lua call; the decide library reads no
// global outside a function (a Redis Functions library's top level sees
// none, and the embedded store's scripts would not notice); and no file
// compares a hit code or algorithm with a number, rather than with the
// generated constants.
func TestLibraryOrder(t *testing.T) {
	type part struct {
		name, code string
		algorithm  string // the algorithm whose file it is
	}
	parts := []part{{name: "Constants", code: constants}, {name: "prelude.lua", code: prelude}}
	var names []string
	for i, a := range algorithm.All() {
		parts = append(parts, part{name: a.Name + ".lua", code: sources[i], algorithm: a.Name})
		names = append(names, a.Name)
	}
	parts = append(parts, part{name: "algorithms table", code: strings.TrimPrefix(algorithmCode(), strings.Join(sources, ""))})
	if !strings.HasPrefix(algorithmCode(), strings.Join(sources, "")) {
		t.Fatal("algorithmCode does not start with the algorithms' files in ID order")
	}
	if library != constants+prelude+algorithmCode() || decideScript != library+rlqsLease+decide+refund+"return decide(KEYS, ARGV)\n" ||
		refundScript != library+rlqsLease+decide+refund+"return undo_charges(KEYS, ARGV)\n" {
		t.Fatal("the scripts are not assembled from library as this test checks them")
	}

	top := newScope(nil)
	for _, p := range parts {
		c := &checker{file: p.name, forbidden: map[string]bool{}}
		for _, n := range names {
			c.forbidden[n] = p.algorithm != "" && n != p.algorithm
		}
		c.check(t, top, p.code)
		if p.algorithm != "" {
			if !top.names[p.algorithm] {
				t.Errorf("%s declares no local table %s", p.name, p.algorithm)
			}
			for _, f := range []string{"check", "commit", "result", "refund", "undo"} {
				if !c.methods[p.algorithm+"."+f] {
					t.Errorf("%s defines no %s.%s", p.name, p.algorithm, f)
				}
			}
		}
	}
	// rlqs_lease.lua, decide.lua, then refund.lua, end the library.
	decideScope := top.clone()
	(&checker{file: "rlqs_lease.lua"}).check(t, decideScope, rlqsLease)
	(&checker{file: "decide.lua"}).check(t, decideScope, decide)
	(&checker{file: "refund.lua"}).check(t, decideScope, refund)
	(&checker{file: "reset.lua", script: true}).check(t, newScope(nil), reset)
	(&checker{file: "rlqs_shares.lua", script: true}).check(t, newScope(nil), rlqsShares)
	(&checker{file: "region_allowance.lua", script: true}).check(t, newScope(nil), regionAllowance)
	(&checker{file: "rlqs_confirm.lua", script: true}).check(t, newScope(nil), rlqsConfirm)
	(&checker{file: "region_sync.lua", script: true}).check(t, newScope(nil), regionSync)
	if !decideScope.names["decide"] || !decideScope.names["undo_charges"] {
		t.Error("decide.lua declares no local decide, or refund.lua no undo_charges, which the scripts and Library call")
	}
}

// TestLibraryOrderChecker: the checker above finds each mistake it is there
// for.
func TestLibraryOrderChecker(t *testing.T) {
	for _, tt := range []struct {
		name, code, want string
		script           bool
	}{
		{"declared after", "local function f() return later() end\nlocal function later() end\n", "uses later", false},
		{"global assigned", "x = 1\n", "assigns the global x", false},
		{"global read at the top", "local floor = math.floor\n", "reads the global math at the top level", false},
		{"global read at a script's top", "local floor = math.floor\n", "", true},
		{"global read in a function", "local function f(x) return math.floor(x) end\n", "", false},
		{"another algorithm's table", "local function f() return gcra.check end\n", "another algorithm's table", false},
		{"a magic flag", "local function f(code) return code % 8 >= 4 end\n", "works code with a number", false},
		{"a magic ID", "local function f(alg) return 2 == alg end\n", "works alg with a number", false},
		{"constants", "local function f(code) return code % FLAG_SHADOW end\n", "", false},
		{"scopes", "local function f(t) for i = 1, 2 do local y = i end return y end\n", "uses y", false},
		{"repeat", "local function f() repeat local done = true until done end\n", "", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			top := newScope(nil)
			top.names["FLAG_SHADOW"], top.names["gcra"] = true, true
			c := &checker{file: "test.lua", script: tt.script, forbidden: map[string]bool{"gcra": true}}
			c.chunk(top, tt.code)
			switch {
			case tt.want == "" && len(c.errs) > 0:
				t.Errorf("errors %q, want none", c.errs)
			case tt.want != "" && !slices.ContainsFunc(c.errs, func(e string) bool { return strings.Contains(e, tt.want) }):
				t.Errorf("errors %q, want one saying %q", c.errs, tt.want)
			}
		})
	}
}

type scope struct {
	parent *scope
	names  map[string]bool
}

func newScope(parent *scope) *scope { return &scope{parent: parent, names: map[string]bool{}} }

func (s *scope) has(name string) bool {
	for ; s != nil; s = s.parent {
		if s.names[name] {
			return true
		}
	}
	return false
}

func (s *scope) clone() *scope {
	c := newScope(s.parent)
	for n := range s.names {
		c.names[n] = true
	}
	return c
}

// checker walks one file's syntax tree, keeping track of the locals in
// scope.
type checker struct {
	errs      []string
	file      string
	script    bool            // a script's top level may read globals
	forbidden map[string]bool // other algorithms' tables
	depth     int             // functions the walk is inside
	methods   map[string]bool // "table.name" of the functions defined at the top level
}

func (c *checker) errorf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}

// check checks code as the file that comes after those whose top-level
// locals top holds, and reports what it found wrong.
func (c *checker) check(t *testing.T, top *scope, code string) {
	t.Helper()
	c.chunk(top, code)
	for _, e := range c.errs {
		t.Error(e)
	}
}

func (c *checker) chunk(top *scope, code string) {
	stmts, err := parse.Parse(strings.NewReader(code), c.file)
	if err != nil {
		c.errorf("%s: %v", c.file, err)
		return
	}
	c.methods = map[string]bool{}
	c.stmts(top, stmts) // the top level: its locals stay for the files after
}

func (c *checker) block(s *scope, stmts []ast.Stmt) { c.stmts(newScope(s), stmts) }

func (c *checker) stmts(s *scope, stmts []ast.Stmt) {
	for _, st := range stmts {
		c.stmt(s, st)
	}
}

func (c *checker) use(s *scope, name string, line int) {
	switch {
	case c.forbidden[name]:
		c.errorf("%s:%d uses %s, another algorithm's table", c.file, line, name)
	case s.has(name):
	case !slices.Contains(redisGlobals, name):
		c.errorf("%s:%d uses %s, which is neither a local declared before it nor a global Redis gives", c.file, line, name)
	case c.depth == 0 && !c.script:
		c.errorf("%s:%d reads the global %s at the top level, where a Redis Functions library sees none", c.file, line, name)
	}
}

func (c *checker) stmt(s *scope, st ast.Stmt) {
	switch st := st.(type) {
	case *ast.LocalAssignStmt:
		fn := len(st.Names) == 1 && len(st.Exprs) == 1 && isFunction(st.Exprs[0])
		if fn { // local function f: f is in scope in its body
			s.names[st.Names[0]] = true
		}
		c.exprs(s, st.Exprs)
		for _, n := range st.Names {
			s.names[n] = true
		}
	case *ast.AssignStmt:
		for _, e := range st.Lhs {
			if id, ok := e.(*ast.IdentExpr); ok && !s.has(id.Value) {
				c.errorf("%s:%d assigns the global %s", c.file, id.Line(), id.Value)
			}
		}
		c.exprs(s, st.Lhs)
		c.exprs(s, st.Rhs)
	case *ast.FuncCallStmt:
		c.expr(s, st.Expr)
	case *ast.DoBlockStmt:
		c.block(s, st.Stmts)
	case *ast.WhileStmt:
		c.expr(s, st.Condition)
		c.block(s, st.Stmts)
	case *ast.RepeatStmt:
		body := newScope(s) // until sees the body's locals
		c.stmts(body, st.Stmts)
		c.expr(body, st.Condition)
	case *ast.IfStmt:
		c.expr(s, st.Condition)
		c.block(s, st.Then)
		c.block(s, st.Else)
	case *ast.NumberForStmt:
		c.exprs(s, []ast.Expr{st.Init, st.Limit, st.Step})
		body := newScope(s)
		body.names[st.Name] = true
		c.stmts(body, st.Stmts)
	case *ast.GenericForStmt:
		c.exprs(s, st.Exprs)
		body := newScope(s)
		for _, n := range st.Names {
			body.names[n] = true
		}
		c.stmts(body, st.Stmts)
	case *ast.FuncDefStmt:
		self := st.Name.Func == nil
		if self {
			c.expr(s, st.Name.Receiver)
		} else {
			c.expr(s, st.Name.Func)
		}
		if c.depth == 0 {
			if get, ok := st.Name.Func.(*ast.AttrGetExpr); ok {
				obj, ok1 := get.Object.(*ast.IdentExpr)
				key, ok2 := get.Key.(*ast.StringExpr)
				if ok1 && ok2 {
					c.methods[obj.Value+"."+key.Value] = true
				}
			}
		}
		c.function(s, st.Func, self)
	case *ast.ReturnStmt:
		c.exprs(s, st.Exprs)
	case *ast.BreakStmt, *ast.LabelStmt, *ast.GotoStmt:
	default:
		c.errorf("%s:%d: statement %T not known to this test", c.file, st.Line(), st)
	}
}

func isFunction(e ast.Expr) bool {
	_, ok := e.(*ast.FunctionExpr)
	return ok
}

func (c *checker) function(s *scope, f *ast.FunctionExpr, self bool) {
	body := newScope(s)
	for _, n := range f.ParList.Names {
		body.names[n] = true
	}
	if self {
		body.names["self"] = true
	}
	c.depth++
	c.stmts(body, f.Stmts)
	c.depth--
}

func (c *checker) exprs(s *scope, es []ast.Expr) {
	for _, e := range es {
		c.expr(s, e)
	}
}

// magic names the variables that hold a hit code or an algorithm's ID.
var magic = map[string]bool{"code": true, "alg": true}

func (c *checker) numberWith(lhs, rhs ast.Expr) {
	for _, pair := range [][2]ast.Expr{{lhs, rhs}, {rhs, lhs}} {
		id, ok := pair[0].(*ast.IdentExpr)
		if _, num := pair[1].(*ast.NumberExpr); ok && num && magic[id.Value] {
			c.errorf("%s:%d works %s with a number: use the generated ALG_ and FLAG_ constants", c.file, id.Line(), id.Value)
		}
	}
}

func (c *checker) expr(s *scope, e ast.Expr) {
	switch e := e.(type) {
	case nil:
	case *ast.IdentExpr:
		c.use(s, e.Value, e.Line())
	case *ast.AttrGetExpr:
		c.expr(s, e.Object)
		c.expr(s, e.Key)
	case *ast.TableExpr:
		for _, f := range e.Fields {
			c.expr(s, f.Key)
			c.expr(s, f.Value)
		}
	case *ast.FuncCallExpr:
		c.expr(s, e.Func)
		c.expr(s, e.Receiver)
		c.exprs(s, e.Args)
	case *ast.LogicalOpExpr:
		c.expr(s, e.Lhs)
		c.expr(s, e.Rhs)
	case *ast.RelationalOpExpr:
		c.numberWith(e.Lhs, e.Rhs)
		c.expr(s, e.Lhs)
		c.expr(s, e.Rhs)
	case *ast.ArithmeticOpExpr:
		c.numberWith(e.Lhs, e.Rhs)
		c.expr(s, e.Lhs)
		c.expr(s, e.Rhs)
	case *ast.StringConcatOpExpr:
		c.expr(s, e.Lhs)
		c.expr(s, e.Rhs)
	case *ast.UnaryMinusOpExpr:
		c.expr(s, e.Expr)
	case *ast.UnaryNotOpExpr:
		c.expr(s, e.Expr)
	case *ast.UnaryLenOpExpr:
		c.expr(s, e.Expr)
	case *ast.FunctionExpr:
		c.function(s, e, false)
	case *ast.TrueExpr, *ast.FalseExpr, *ast.NilExpr, *ast.NumberExpr, *ast.StringExpr, *ast.Comma3Expr:
	default:
		c.errorf("%s:%d: expression %T not known to this test", c.file, e.Line(), e)
	}
}
