package lua

import (
	"embed"
	"fmt"
	"strings"
)

// The flags of a hit's code: decide.lua reads a hit's code as its
// algorithm's ID plus any of these. Every ID is below FlagShadow. The Lua
// sees them as FLAG_SHADOW, FLAG_RECORD, FLAG_REFUND, FLAG_QUOTA and
// FLAG_OLDEST (see Constants).
const (
	FlagShadow = 8  // a shadow hit: never denies its request
	FlagRecord = 16 // a cost recorded even when it does not fit
	FlagRefund = 32 // a refund of cost units
	FlagQuota  = 64 // a quota hit (quota_mode)
	// FlagOldest makes a refund give back the oldest units first instead of
	// the newest (refund_order: oldest; the log only): a concurrency limit's
	// release, which cannot name the seat it frees.
	FlagOldest = 128
)

// Algorithm describes one rate limit algorithm: everything the Go side
// needs to name it, key it and call its Lua code.
type Algorithm struct {
	// ID is the algorithm's number in the hit codes of decide.lua and in
	// refund.lua's arguments, and its index in decide.lua's algorithms
	// table. The Lua sees it as ALG_<NAME> (see Constants).
	ID int
	// Name is the algorithm's name in the config file. It is also the name
	// of its Lua file (Name + ".lua") and of the local table that file
	// defines, with the functions check, commit, result and refund.
	Name string
	// Key ends the algorithm's store keys, before the window: a counter of
	// one algorithm is never read as another's. An algorithm with
	// ReferenceKeys has it only as its name among the others' codes.
	Key string
	// ReferenceKeys marks an algorithm keyed as envoyproxy/ratelimit keys
	// its counters (limiter.KeyBuilder's ResetReference), so that its
	// replicas and this service share them.
	ReferenceKeys bool
	// State says what the algorithm keeps at its key.
	State string
	// Bucket marks a token bucket (GCRA): its hits carry the bucket's size
	// (":burst" after the cost), which is the most its counter holds, and
	// its refunds take the hit's limit and window.
	Bucket bool
	// MaxCost is the largest cost the algorithm's Lua is exact for; larger
	// costs are sent as MaxCost, which no counter holds anyway.
	MaxCost uint64
	// MaxLimit is the largest limit a rule of this algorithm may have, 0
	// for no bound; MaxLimitWhy says why, in the config's error message.
	MaxLimit    uint32
	MaxLimitWhy string

	source string // the Lua file's text, read from algorithmFiles
}

// algorithmFiles holds every algorithm's Lua file, Name + ".lua".
//
//go:embed *.lua
var algorithmFiles embed.FS

// Algorithms are the algorithms the Lua implements, in ID order (IDs 1, 2,
// ...): the order their files are concatenated in and their index in
// decide.lua's algorithms table. internal/config takes its algorithm names
// from here, and internal/limiter everything else it sends to Redis. A new
// algorithm is one entry here plus its Lua file (see Algorithm.Name), which
// the *.lua embed below picks up.
var Algorithms = withSources([]Algorithm{
	{
		ID: 1, Name: "sliding_window_log", Key: "log",
		State:   "a sorted set of the admitted units, scored by the microsecond they came",
		MaxCost: 1 << 53, // Lua numbers are exact up to 2^53; see prelude.lua's max_count
		// The log stores one member per admitted unit, so memory per key,
		// and the time one script holds Redis to record a heavy weighted
		// hit, grow with the limit; beyond this the sliding_window_counter
		// keeps constant memory.
		MaxLimit:    10_000,
		MaxLimitWhy: "one stored member per unit; use sliding_window_counter",
	},
	{
		ID: 2, Name: "sliding_window_counter", Key: "counter",
		State:   `the string "<window index>:<count>:<previous window's count>"`,
		MaxCost: 1 << 53,
	},
	{
		ID: 3, Name: "fixed_window", Key: "fixed",
		State:   `the string "<window index>:<count>"`,
		MaxCost: 1 << 53,
	},
	{
		ID: 4, Name: "gcra", Key: "gcra",
		State:   `the string "<whole>:<remainder>", the bucket's theoretical arrival time in Unix microseconds`,
		Bucket:  true,
		MaxCost: 1 << 32, // gcra.lua is exact for costs up to 2^32
	},
	{
		ID: 5, Name: "reference_fixed_window", Key: "reference", ReferenceKeys: true,
		State:   "envoyproxy/ratelimit's count, a plain integer, at its own key for the window",
		MaxCost: 1 << 53,
	},
})

// withSources fills each algorithm's source from its file. It runs as the
// table is initialised, before the scripts built from it.
func withSources(algorithms []Algorithm) []Algorithm {
	for i := range algorithms {
		a := &algorithms[i]
		code, err := algorithmFiles.ReadFile(a.Name + ".lua")
		if err != nil {
			// A build without an algorithm's file cannot decide anything:
			// every test fails at once, before anything ships.
			panic(fmt.Sprintf("scripts/lua: algorithm %s has no file: %v", a.Name, err))
		}
		a.source = string(code)
	}
	return algorithms
}

// ByID returns the algorithm whose ID is id.
func ByID(id int) (*Algorithm, bool) {
	if id < 1 || id > len(Algorithms) {
		return nil, false
	}
	return &Algorithms[id-1], true
}

// luaConstant is the name under which the Lua sees an algorithm's ID.
func (a *Algorithm) luaConstant() string { return "ALG_" + strings.ToUpper(a.Name) }

// Constants is the Lua that declares the numbers shared with Go: the hit
// code flags and every algorithm's ID. It comes first in every script and
// library built here, so the Lua never spells those numbers itself.
var Constants = func() string {
	var b strings.Builder
	b.WriteString("-- Generated by scripts/lua/algorithms.go: the numbers the Go side sends.\n")
	fmt.Fprintf(&b, "local FLAG_SHADOW, FLAG_RECORD, FLAG_REFUND, FLAG_QUOTA, FLAG_OLDEST = %d, %d, %d, %d, %d\n",
		FlagShadow, FlagRecord, FlagRefund, FlagQuota, FlagOldest)
	for i := range Algorithms {
		fmt.Fprintf(&b, "local %s = %d\n", Algorithms[i].luaConstant(), Algorithms[i].ID)
	}
	return b.String()
}()

// algorithmCode is every algorithm's file, in ID order, then decide.lua's
// algorithms table, which indexes them by ID.
func algorithmCode() string {
	var b strings.Builder
	names := make([]string, len(Algorithms))
	for i := range Algorithms {
		b.WriteString(Algorithms[i].source)
		names[i] = Algorithms[i].Name
	}
	b.WriteString("-- Generated by scripts/lua/algorithms.go: the algorithms by ID.\n")
	b.WriteString("local algorithms = { " + strings.Join(names, ", ") + " }\n")
	return b.String()
}
