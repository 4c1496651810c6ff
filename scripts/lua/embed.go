// Package lua holds the Redis Lua scripts of the rate limiter, embedded into
// the binary so the deployed service always runs the scripts it was tested
// with. Each script is a function returning its text, its calling convention
// documented at the top of the .lua file of its name.
//
// Each algorithm's file defines a local table of five functions (check,
// commit, result, refund, undo) on prelude.lua's helpers; which algorithms
// there are, and their IDs, comes from internal/algorithm's table, and
// Constants declares them and the operation kinds (Ops) to the Lua.
// decide.lua runs the algorithms on a batch of requests, each all or
// nothing, and refund.lua undoes its charges: both reach Redis as Library, a
// Redis Functions library (Redis 7 and later, FCALL), or as the scripts
// Decide and Refund (EVALSHA, older servers).
package lua

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
)

var (
	//go:embed prelude.lua
	prelude string
	//go:embed decide.lua
	decide string
	//go:embed rlqs_lease.lua
	rlqsLease string
	//go:embed reset.lua
	reset string
	//go:embed refund.lua
	refund string
	//go:embed water_level.lua
	waterLevel string
	//go:embed rlqs_shares.lua
	rlqsSharesFile string
	//go:embed rlqs_confirm.lua
	rlqsConfirm string
	//go:embed region_allowance.lua
	regionAllowanceFile string
	//go:embed region_sync.lua
	regionSync string
)

// library is the code decide.lua and refund.lua run on. The files share
// locals, which Lua sees only after their declaration, so the order is
// fixed: the generated constants, which every file may use; prelude.lua,
// the helpers of every algorithm; each algorithm's file, in ID order (an
// algorithm file uses the two above, never another algorithm's file); then
// the generated algorithms table, which names every algorithm's table.
// TestLibraryOrder checks that every name a file uses is declared before it.
var library = constants + prelude + algorithmCode()

// decideCode defines the local functions decide(keys, args) and
// undo_charges(keys, args), which the scripts and the library call;
// rlqs_lease.lua, before decide.lua, the condition of an RLQS fleet's lease.
var (
	decideCode   = library + rlqsLease + decide + refund
	decideScript = decideCode + "return decide(KEYS, ARGV)\n"
	refundScript = decideCode + "return undo_charges(KEYS, ARGV)\n"
)

// version names the decide code: instances running different code register
// different functions, so a rolling update never runs one version's
// arguments through the other's code.
var version = func() string {
	sum := sha1.Sum([]byte(decideCode))
	return hex.EncodeToString(sum[:6])
}()

var (
	decideFunction  = "ratelimit_decide_" + version
	refundFunction  = "ratelimit_refund_" + version
	functionLibrary = "#!lua name=ratelimit_" + version + "\n" + decideCode +
		"redis.register_function('" + decideFunction + "', decide)\n" +
		"redis.register_function('" + refundFunction + "', undo_charges)\n"
)

// The registries that split a limit share one water-filling.
var (
	rlqsShares      = waterLevel + rlqsSharesFile
	regionAllowance = waterLevel + regionAllowanceFile
)

// Decide returns the script that decides a batch of requests.
func Decide() string { return decideScript }

// DecideFunction returns the name under which Library registers decide:
// "ratelimit_decide_" and a hash of the code. FCALL takes the same keys and
// arguments as Decide.
func DecideFunction() string { return decideFunction }

// Library returns the Redis Functions library (FUNCTION LOAD) that registers
// DecideFunction and RefundFunction. It declares no flags: it writes, so
// Redis refuses it as a whole, before it runs, when maxmemory is reached,
// and its keys share one slot in a cluster.
func Library() string { return functionLibrary }

// Reset returns the script that deletes one counter, whatever its algorithm.
func Reset() string { return reset }

// Refund returns the script that undoes charges made by Decide, by the
// tokens it returned.
func Refund() string { return refundScript }

// RefundFunction returns the name under which Library registers Refund's
// code: "ratelimit_refund_" and the hash DecideFunction's name carries.
func RefundFunction() string { return refundFunction }

// RLQSShares returns the script that decides one Envoy's share of a limit
// in the registry of RLQS assignments.
func RLQSShares() string { return rlqsShares }

// RLQSConfirm returns the script that lowers a member's entry in the
// registry of RLQS assignments to the share it was sent.
func RLQSConfirm() string { return rlqsConfirm }

// RegionAllowance returns the script that keeps the ledger's registry of a
// global counter's regional allowances and decides one region's.
func RegionAllowance() string { return regionAllowance }

// RegionSync returns the script that keeps a region's record of a global
// counter's grant, shared by the region's instances.
func RegionSync() string { return regionSync }
