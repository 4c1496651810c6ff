package hotkeys

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/decision"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/luastore"
	"github.com/slidingwindow/ratelimit/internal/rlqs"
	"github.com/slidingwindow/ratelimit/scripts/lua"
)

// The simulator's run of one schedule (see sim_test.go): the store whose
// clock and faults it owns, the instances' ledger, the Envoys' RLQS
// buckets, and each event applied.

// simStore is the stores the instances share: the main one, a miniredis,
// its client and limiter, and the per-second one (REDIS_PERSECOND: the
// one-second rules' store, limiter.Split), each with its gate; reused
// across schedules (flushed between them).
type simStore struct {
	m, ms       *miniredis.Miniredis
	lua         *luastore.Store // m's scripts and functions
	lim, second *limiter.Limiter
	gate, gateS *simGate
	// cluster is a limiter on a Redis Cluster of two nodes: m, which
	// holds the rule's hash slot, and mo, every other slot (go-redis's
	// cluster client, told the slots): a request's keys of both go as two
	// decide calls, all or nothing by a give-back.
	cluster      *limiter.Limiter
	mo           *miniredis.Miniredis
	gateC, gateO *simGate // m's and mo's, as the cluster's nodes
}

func newSimStore(t *testing.T) *simStore {
	t.Helper()
	st := &simStore{}
	limiterOn := func(client redis.UniversalClient) *limiter.Limiter {
		t.Cleanup(func() { client.Close() })
		lim := limiter.New(client, &limiter.Options{Timeout: 10 * time.Second, DenyCache: -1})
		t.Cleanup(lim.Close)
		return lim
	}
	// The clients reach the stores in-process, through a buffered
	// connection in memory (simConnPair): the search does not spend its
	// time in the loopback's system calls, nor in net.Pipe's handovers;
	// each is served in one goroutine (luastore's ServeConn).
	byPort := map[string]*luastore.Store{}
	dial := func(_ context.Context, _, addr string) (net.Conn, error) {
		_, port, _ := net.SplitHostPort(addr)
		store, ok := byPort[port]
		if !ok {
			return nil, fmt.Errorf("no store at %s", addr)
		}
		client, server := simConnPair()
		store.ServeConn(server)
		return client, nil
	}
	plain := func(m *miniredis.Miniredis) (*limiter.Limiter, *simGate) {
		g := newSimGate()
		client := redis.NewClient(&redis.Options{Addr: m.Addr(), Dialer: dial, DialerRetries: 1})
		client.AddHook(g)
		return limiterOn(client), g
	}
	var ms, mo *luastore.Store
	st.m, st.lua = luastore.RunT(t)
	st.ms, ms = luastore.RunT(t)
	st.mo, mo = luastore.RunT(t)
	byPort[st.m.Port()], byPort[st.ms.Port()], byPort[st.mo.Port()] = st.lua, ms, mo
	for _, m := range []*miniredis.Miniredis{st.m, st.ms, st.mo} {
		// Keys' lives run with the simulator's clock, as in Redis (the
		// reference's keys name a charge by their expiry); a store holds
		// one schedule's few keys.
		m.ClockTTL(true)
	}
	st.lim, st.gate = plain(st.m)
	st.second, st.gateS = plain(st.ms)
	st.gateC, st.gateO = newSimGate(), newSimGate()
	node := func(start, end int, m *miniredis.Miniredis) redis.ClusterSlot {
		return redis.ClusterSlot{Start: start, End: end, Nodes: []redis.ClusterNode{{Addr: m.Addr()}}}
	}
	ruleSlot := simSlot(simKeyName)
	slots := []redis.ClusterSlot{node(0, ruleSlot-1, st.mo), node(ruleSlot, ruleSlot, st.m), node(ruleSlot+1, 16383, st.mo)}
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		ClusterSlots:  func(context.Context) ([]redis.ClusterSlot, error) { return slots, nil },
		Dialer:        dial,
		DialerRetries: 1,
	})
	// The limiter calls a node's own client: the node's gate goes on it.
	// (go-redis names a loopback node by its port alone.)
	cc.OnNewNode(func(c *redis.Client) {
		if _, port, _ := strings.Cut(c.Options().Addr, ":"); port == st.m.Port() {
			c.AddHook(st.gateC)
		} else {
			c.AddHook(st.gateO)
		}
	})
	st.cluster = limiterOn(cc)
	return st
}

// simSlot is key's Redis Cluster hash slot: CRC-16/XMODEM of its hash tag,
// modulo 16384.
func simSlot(key string) int {
	tag := key[strings.IndexByte(key, '{')+1 : strings.IndexByte(key, '}')]
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc % 16384)
}

// simGate sees every command a store's client sends: it counts the script
// and function calls that landed (lands), so that the simulator knows when a call made on another
// goroutine (a part of a request Split sends, a give-back in the
// background) has landed, and it can park the next call until the
// simulator lets it go: a slow store.
type simGate struct {
	mu       sync.Mutex
	changed  *sync.Cond
	answered int
	parked   bool          // a call is parked
	park     bool          // the next call parks
	release  chan struct{} // closed to let the parked call go
	// parkedDone is closed once the parked call's pass ends, which
	// parkedLanded and parkedCharged then tell of.
	parkedDone                  chan struct{}
	parkedLanded, parkedCharged bool
	// failKey makes the next decide call with this key fail on its way.
	failKey string
	// charges[i]: call i charged a hit (decide.lua's reply: four numbers
	// a hit, the first its state, 2 or 3 charged); denies[i]: call i's
	// first hit was denied (state 0).
	charges, denies []bool
}

// lands reports whether cmd ran a script or function call on the store:
// not one the store had no code for (NOSCRIPT, or a function library lost
// in a restart), which the limiter loads and sends again, nor the loading.
func lands(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "fcall", "evalsha", "eval":
	default:
		return false
	}
	err := cmd.Err()
	return err == nil || !strings.HasPrefix(err.Error(), "NOSCRIPT") && !strings.Contains(err.Error(), "Function not found")
}

// decided reports whether a decide call charged any of its hits, and
// whether it denied its first.
func decided(c redis.Cmder) (charged, deniedFirst bool) {
	var vals []int64
	var err error
	switch c := c.(type) {
	case *redis.IntSliceCmd:
		vals, err = c.Result()
	case *redis.Cmd:
		vals, err = c.Int64Slice()
	}
	if err != nil || len(vals) < 4 {
		return false, false
	}
	for j := 0; j < len(vals); j += 4 {
		if vals[j] >= 2 {
			charged = true
		}
	}
	return charged, vals[0] == 0
}

// chargedBy reports whether call i (counted from 0) charged a hit.
func (g *simGate) chargedBy(i int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return i < len(g.charges) && g.charges[i]
}

// deniedBy reports whether call i (counted from 0) denied its first hit.
func (g *simGate) deniedBy(i int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return i < len(g.denies) && g.denies[i]
}

func newSimGate() *simGate {
	g := &simGate{}
	g.changed = sync.NewCond(&g.mu)
	return g
}

func (g *simGate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *simGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return g.pass([]redis.Cmder{cmd}, func(cmds []redis.Cmder) error { return next(ctx, cmds[0]) })
	}
}

func (g *simGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		return g.pass(cmds, func(cmds []redis.Cmder) error { return next(ctx, cmds) })
	}
}

func (g *simGate) pass(cmds []redis.Cmder, send func([]redis.Cmder) error) error {
	g.mu.Lock()
	var parkedDone chan struct{}
	if g.park {
		g.park, g.parked = false, true
		release := g.release
		parkedDone = g.parkedDone
		g.changed.Broadcast()
		g.mu.Unlock()
		<-release
		g.mu.Lock()
		g.parked = false
	}
	var failed redis.Cmder
	if g.failKey != "" {
		if i := slices.IndexFunc(cmds, func(c redis.Cmder) bool { return isDecide(c) && hasKeyArg(c, g.failKey) }); i >= 0 {
			failed, g.failKey = cmds[i], ""
			cmds = slices.Delete(slices.Clone(cmds), i, i+1)
		}
	}
	g.mu.Unlock()
	var err error
	if len(cmds) > 0 {
		err = send(cmds)
	}
	if failed != nil {
		failed.SetErr(errSimFailed)
		cmds = append(cmds, failed)
		err = cmp.Or(err, errSimFailed)
	}
	g.mu.Lock()
	for _, c := range cmds {
		if lands(c) {
			g.answered++
			charged, denied := decided(c)
			g.charges, g.denies = append(g.charges, charged), append(g.denies, denied)
			if parkedDone != nil {
				g.parkedLanded, g.parkedCharged = true, g.parkedCharged || charged
			}
		}
	}
	if parkedDone != nil {
		close(parkedDone)
	}
	g.changed.Broadcast()
	g.mu.Unlock()
	return err
}

// isDecide reports a decide call (refunds are calls of the library too).
func isDecide(c redis.Cmder) bool {
	args := c.Args()
	return c.Name() == "fcall" && len(args) > 1 && args[1] == lua.DecideFunction()
}

func hasKeyArg(c redis.Cmder, name string) bool {
	return slices.ContainsFunc(c.Args(), func(a any) bool { s, ok := a.(string); return ok && isKey(s, name) })
}

// reset forgets the calls answered: a schedule's calls are all awaited
// before the next one starts.
func (g *simGate) reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.answered, g.charges, g.denies, g.failKey = 0, nil, nil, ""
}

// count is the calls answered so far.
func (g *simGate) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.answered
}

// await waits until the calls answered reach n, or a call parks when
// parked is set.
func (g *simGate) await(n int, parked bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.answered < n && (!parked || !g.parked) {
		g.changed.Wait()
	}
}

// A call the limiter owes the store (a settlement whose caller left) is
// awaited for simOwedWait of real time, far more than it takes, and a
// schedule in which it never lands is reported as simNeverSent.
const (
	simOwedWait  = 10 * time.Second
	simNeverSent = "a call owed to the store never reached it"
)

// awaitFor waits until the calls answered reach n, for at most d of real
// time (a call the limiter owes the store and never sends would be awaited
// for ever); it reports whether they did.
func (g *simGate) awaitFor(n int, d time.Duration) bool {
	g.mu.Lock()
	done := g.answered >= n
	g.mu.Unlock()
	if done { // mostly: no timer to start
		return true
	}
	end := time.Now().Add(d) // before the timer, whose one broadcast ends the wait
	t := time.AfterFunc(d, func() {
		g.mu.Lock()
		g.changed.Broadcast()
		g.mu.Unlock()
	})
	defer t.Stop()
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.answered < n && time.Now().Before(end) {
		g.changed.Wait()
	}
	return g.answered >= n
}

// awaitParked waits until a call parks, or done closes first (no call
// came); it reports whether one parked.
func (g *simGate) awaitParked(done <-chan struct{}) bool {
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-done:
			g.mu.Lock()
			g.changed.Broadcast()
			g.mu.Unlock()
		case <-stop:
		}
	}()
	g.mu.Lock()
	defer g.mu.Unlock()
	for !g.parked {
		select {
		case <-done:
			return false
		default:
		}
		g.changed.Wait()
	}
	return true
}

// awaitParkedPass waits until the parked call's pass ends, and reports
// whether it landed and whether it charged.
func (g *simGate) awaitParkedPass() (landed, charged bool) {
	g.mu.Lock()
	done := g.parkedDone
	g.mu.Unlock()
	<-done
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.parkedLanded, g.parkedCharged
}

// parkNext parks the next call; the function returned lets it go.
func (g *simGate) parkNext() func() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.park, g.release = true, make(chan struct{})
	g.parkedDone, g.parkedLanded, g.parkedCharged = make(chan struct{}), false, false
	release := g.release
	return func() {
		g.mu.Lock()
		g.park = false // if no call came
		g.mu.Unlock()
		close(release)
	}
}

// simKey is one key of a store snapshot.
type simKey struct {
	name, str string
	members   map[string]float64
	fields    map[string]string
	expires   time.Time // zero: none
}

// snapshot is the store's content at now.
func (st *simStore) snapshot(now time.Time) []simKey {
	var keys []simKey
	for _, name := range st.m.Keys() {
		k := simKey{name: name}
		switch st.m.Type(name) {
		case "string":
			k.str, _ = st.m.Get(name)
		case "zset":
			members, _ := st.m.ZMembers(name)
			k.members = make(map[string]float64, len(members))
			for _, mem := range members {
				k.members[mem], _ = st.m.ZScore(name, mem)
			}
		case "hash":
			fields, _ := st.m.HKeys(name)
			k.fields = make(map[string]string, len(fields))
			for _, f := range fields {
				k.fields[f] = st.m.HGet(name, f)
			}
		default:
			panic("simulator: a key of type " + st.m.Type(name))
		}
		if ttl := st.m.TTL(name); ttl > 0 {
			k.expires = now.Add(ttl)
		}
		keys = append(keys, k)
	}
	return keys
}

// restore makes the store hold keys at now, less those expired since.
func (st *simStore) restore(keys []simKey, now time.Time) {
	st.m.FlushAll()
	for _, k := range keys {
		if !k.expires.IsZero() && !k.expires.After(now) {
			continue
		}
		switch {
		case k.members != nil:
			for mem, score := range k.members {
				_, _ = st.m.ZAdd(k.name, score, mem)
			}
		case k.fields != nil:
			for f, v := range k.fields {
				st.m.HSet(k.name, f, v)
			}
		default:
			_ = st.m.Set(k.name, k.str)
		}
		if !k.expires.IsZero() {
			st.m.SetTTL(k.name, k.expires.Sub(now))
		}
	}
}

// simWrite is a store call acknowledged: the store after it, and the units
// it charged (what a failover that loses it may add), and the slice's
// lease it was, if one.
type simWrite struct {
	keys    []simKey
	charged uint64
	lease   *simLeaseRef
}

// simLeaseRef names a slice's lease: its instance, its key, and its token
// (which names it among the key's slices alone: the slices of two keys
// leased in one call share their record's name).
type simLeaseRef struct {
	inst  int
	key   string
	token int64
}

// slice is the live slice the lease made, or nil.
func (r *simRun) slice(l *simLeaseRef) *slice {
	s := r.slices[l.inst]
	sh := s.shard(l.key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if k := sh.keys[l.key]; k != nil {
		for _, sl := range k.slices {
			if sl.token == l.token {
				return sl
			}
		}
	}
	return nil
}

var errSimLost = errors.New("simulator: the reply was lost")

// errSimFailed is a store call that failed on its way (a timeout, a
// connection lost before the write): nothing applied.
var errSimFailed = fmt.Errorf("%w: simulator: the call failed on its way", limiter.ErrStore)

// simRun runs one schedule.
type simRun struct {
	st     *simStore
	rule   simRule
	limit  uint32
	now    time.Time // Redis TIME, the truth
	slices []*Slices
	alloc  *rlqs.Allocator
	envoys []*simEnvoyBucket
	gather []func() // an instance's gathered leases, waiting to be sent
	due    []time.Time

	ops  []simOp
	next int // the next op to run
	// failovers counts the failovers among ops still to run: a write
	// after the last needs no snapshot.
	failovers int

	writes    []simWrite // the last few acknowledged calls, the oldest first; writes[0] is the base
	applied   bool       // the last store call applied, its reply lost or not
	loseReply bool
	failCall  int     // the store call that many from now fails unapplied (0: none)
	during    []simOp // run between the next lease's write and its answer
	hold      int     // the next lease sent answers after this many of the events next
	slowPart  []simOp // run while the next request's other part waits on its store
	main      *limiter.Limiter
	gate      *simGate // main's
	slowGate  *simGate // the other part's store's: the per-second one, or the Cluster's other node
	partBusy  bool     // a request's other part is waiting: the events run meanwhile hit the rule alone
	// answeredLate: the request just decided had a part that answered
	// after other events (simSlowPart), so its other part was decided
	// before them, at a state the oracle no longer holds.
	answeredLate bool
	// leaving: the request being decided loses its caller (simRun.leave);
	// partsLanded, for a request of parts, closes once its other part's
	// call landed, before the caller leaves (else that call would go or
	// not by the goroutines' race).
	leaving     bool
	partsLanded chan struct{}
	pending     int          // the admission a request's main part charged before its answer (simRun.charged), or -1
	pendingFor  *limiter.Hit // the request whose admission pending is (simRequest)
	// backOwed is the refund the request being decided carries (simOp.back),
	// which the oracle cancels once the store call carrying it landed.
	backOwed uint64
	// inflight is the leases written whose answers are on their way, the
	// innermost last (a lease's answer can wait on events that send
	// another: simHold within simHold).
	inflight []simInflight

	admitted []simAdmission
	// rlqsLeases are the Envoys' leases the store charged; until
	// unsureUntil the store may hold what no one knows of (a lost reply's
	// charge, a failed give-back): no denial is checked (simRun.denied).
	rlqsLeases []simLease
	// leaseTops is, for GCRA, the RLQS leases of the rule's key whose
	// records live (no give-back, Reset, restart or failover since), by
	// token: the TAT each left and its units, whose time a client's refund
	// never takes.
	leaseTops   map[int64]simLeaseTop
	unsureUntil time.Time
	sinceAt     time.Time // when since was set
	restartAt   time.Time // the last restart
	since       int       // the first admission after the last Reset or restart: the count starts again
	// keptMembers is, for the log, what a Reset kept of other instances'
	// slices whose members (recorded at the slice's end) were still ahead:
	// the units they had spent, whose members stay, while their admissions
	// are before since; by the slice's token.
	keptMembers map[int64]simKept
	// givenBack is, for the log, the units given back of each slice of
	// the rule's key, by its token: what of an ended slice's members the
	// store no longer holds.
	givenBack       map[int64]uint64
	seats           []simSeat // a seats rule's leases, the oldest first
	seatsFrom       int       // the first seat after the last Reset or restart
	faults          []simFault
	debts           []simFault // costs recorded past the limit (simRecord): their units
	reloads         []simReload
	violation       string   // the first found by an event run during a call (runDuring)
	tracing         bool     // keep the trace: a failing schedule described
	trace           []string // what happened, for a failing schedule
	local           int      // hits decided from a slice
	leased          uint64   // units leased
	leases          int      // leases sent to the store
	byBuckets       uint64   // units Envoys' RLQS buckets admitted
	denialsChecked  int      // against what the store holds (simRun.denied)
	left, leftParts int      // callers that left (simRun.leave), those of requests of parts
	recorded        int      // costs recorded (simRecord) that the store applied
	unlanded        int      // denied requests' give-backs that did not land within simOwedWait
	tatsChecked     int      // GCRA give-backs and refunds checked against the TAT they leave
	answersChecked  int      // admissions' remaining checked (simRun.answer)
	// sinceCharge, while a GCRA request's other part waits, follows the
	// rule key's charges at the store since that request's own (its
	// give-back must leave them counted); nil else.
	sinceCharge *simSinceCharge
}

// simSinceCharge is the rule key's GCRA charges at the store since a
// request's own, while its other part waits: with the TAT before that
// request, what the TAT would be had it never come.
type simSinceCharge struct {
	charges []simTimedCharge
	// unmodelled: a call ran that the model does not follow (a refund, a
	// lease, a failure), so nothing is checked.
	unmodelled bool
}

type simTimedCharge struct {
	at    time.Time
	units uint64
}

// note follows a call of hits that returned v.
func (s *simSinceCharge) note(hits []limiter.Hit, v []limiter.Verdict, err error, now time.Time) {
	if err != nil {
		s.unmodelled = true
		return
	}
	var units uint64
	for i, h := range hits {
		if !isKey(h.Key, simKeyName) {
			continue
		}
		if h.Refund || h.Record || h.Lease || h.Settle != "" || h.Ahead > 0 {
			s.unmodelled = true
		}
		if v[i].Charged {
			units += h.Cost
		}
	}
	if units > 0 {
		s.charges = append(s.charges, simTimedCharge{at: now, units: units})
	}
}

// plainEvents reports whether ops are hits and the clock moving alone, of
// which simSinceCharge follows every store call.
func plainEvents(ops []simOp) bool {
	for _, o := range ops {
		if o.kind != simAdvance && (o.kind != simHit || o.back > 0 || o.leaves) {
			return false
		}
	}
	return true
}

const simKeyName, simSecondKey, simOtherKey = "{sim}:k", "{sim}:s", "{simo}:o"

func (r *simRun) hit(cost uint64) limiter.Hit {
	return limiter.Hit{Key: r.key(simKeyName, r.rule.window), Algorithm: r.rule.alg, Limit: r.limit, Window: r.rule.window, Burst: r.rule.burst, Cost: cost}
}

// key is the store key of the counter named name whose window is w: name
// itself, but for the reference's keys, which name the window they count
// by its start (by the instance's clock, which is the store's here), as
// limiter.KeyBuilder does.
func (r *simRun) key(name string, w time.Duration) string {
	if !r.rule.alg.ReferenceKeys() {
		return name
	}
	return name + "_" + strconv.FormatInt(r.now.Truncate(w).Unix(), 10)
}

// isKey reports whether key is the counter named name, of any window.
func isKey(key, name string) bool { return strings.HasPrefix(key, name) }

// request is the hits of a request of cost units: the rule's (two, of
// costs adding up to it, when o is twice: two descriptors of one counter,
// which the limiter decides as one charge), a refund of the rule's counter
// when o carries one (of at most what the client was admitted), and the
// per-second rule's unless the rule has none or o hits the rule alone.
func (r *simRun) request(o simOp) decision.Request {
	hits := []limiter.Hit{r.hit(o.n)}
	if o.twice {
		hits = []limiter.Hit{r.hit(o.n / 2), r.hit(o.n - o.n/2)}
	}
	r.backOwed = 0
	if n := min(o.back, r.refundable()); n > 0 {
		h := r.hit(n)
		h.Refund = true
		hits = append(hits, h)
		r.backOwed = n
	}
	if r.rule.perSecond > 0 && !o.only && !r.partBusy {
		hits = append(hits, limiter.Hit{Key: r.key(simSecondKey, time.Second), Algorithm: r.rule.alg, Limit: r.rule.perSecond, Window: time.Second, Cost: o.n})
	}
	if r.rule.otherSlot > 0 && !o.only && !r.partBusy {
		w := r.rule.otherWindow
		burst := r.rule.burst
		if w != r.rule.window {
			burst = 0
		}
		h := limiter.Hit{Key: r.key(simOtherKey, w), Algorithm: r.rule.alg, Limit: r.rule.otherSlot, Window: w, Burst: burst, Cost: o.n}
		if r.rule.otherDenies {
			h.FailureMode = config.FailureDeny
		}
		hits = append(hits, h)
	}
	return decision.Request{Hits: hits, Routes: make([]decision.Route, len(hits))}
}

// simRequestKey is the context key of the request a store call is of: its
// hits, as simRun.apply has them.
type simRequestKey struct{}

// simRequest tags ctx with the request of hits, for the ledger's calls to
// tell its own (simRun.pendingFor) from leases' and others'.
func simRequest(ctx context.Context, hits []limiter.Hit) context.Context {
	return context.WithValue(ctx, simRequestKey{}, &hits[0])
}

// parted reports a request of parts (on two stores, or two Cluster slots):
// the limiter names its log charge as a part's.
func (r *simRun) parted(hits []limiter.Hit) bool {
	for _, h := range hits {
		if !isKey(h.Key, simKeyName) {
			return true
		}
	}
	return false
}

// rulesCost is the cost of the charges of the rule's counter.
func (r *simRun) rulesCost(hits []limiter.Hit) uint64 {
	var n uint64
	for _, h := range hits {
		if isKey(h.Key, simKeyName) && !h.Refund {
			n += h.Cost
		}
	}
	return n
}

// simLedger is the instances' ledger: the real Split, with the store's
// faults and the events run while a lease's answer is on its way.
type simLedger struct {
	r     *simRun
	split *limiter.Split
	rlqs  bool // the allocator's: its charges are the Envoys' leases
}

func (l simLedger) Decide(ctx context.Context, hits []limiter.Hit) ([]limiter.Verdict, error) {
	since := l.r.sinceCharge
	if since != nil && (l.rlqs || l.r.failCall > 0 || l.r.loseReply) {
		since.unmodelled = true
	}
	if err := l.r.failing(); err != nil {
		v := make([]limiter.Verdict, len(hits))
		for i := range hits {
			v[i] = limiter.Verdict{FailureVerdict: true, Admitted: hits[i].Refund, ResetAfter: limiter.FailureRetry}
		}
		return v, err
	}
	leaser := -1
	for i, s := range l.r.slices {
		if ctx == s.ctx {
			l.r.leases++
			leaser = i
		}
	}
	v, err := l.decide(ctx, hits)
	if since != nil {
		since.unmodelled = since.unmodelled || leaser >= 0
		since.note(hits, v, err, l.r.now)
	}
	var charged uint64
	for i := range v {
		// A settlement records its actual cost whatever the verdict says.
		if v[i].Charged && !hits[i].Refund || hits[i].Settle != "" {
			charged += hits[i].Cost
		}
	}
	if l.rlqs {
		for i := range v {
			if v[i].Charged && hits[i].Ahead > 0 && !hits[i].Refund {
				l.r.rlqsLeases = append(l.r.rlqsLeases, simLease{at: l.r.now, end: l.r.now.Add(hits[i].Ahead), units: hits[i].Cost})
				if l.r.semantics() == config.GCRA && isKey(hits[i].Key, simKeyName) {
					if l.r.leaseTops == nil {
						l.r.leaseTops = map[int64]simLeaseTop{}
					}
					l.r.leaseTops[v[i].Token] = simLeaseTop{tat: l.r.gcraTAT(), units: hits[i].Cost}
				}
			}
		}
	}
	var lease *simLeaseRef
	if leaser >= 0 && len(v) == 1 && v[0].Charged {
		lease = &simLeaseRef{inst: leaser, key: hits[0].Key, token: v[0].Token}
	}
	// A request one part of which failed (simFailSlot) wrote the other's
	// charge: a write a failover can lose like any other.
	ackErr := err
	if charged > 0 {
		ackErr = nil
	}
	if ackErr = l.r.acknowledge(charged, lease, ackErr); ackErr != nil {
		err = ackErr
	}
	// The events held for this call run between its write and its answer,
	// a lost one included.
	if during := l.r.during; during != nil {
		l.r.during = nil
		if leaser >= 0 {
			// A lease on its way is a slice a restart or another
			// instance's Reset can forget, as a live one.
			l.r.inflight = append(l.r.inflight, simInflight{units: charged, inst: leaser})
			defer func() { l.r.inflight = l.r.inflight[:len(l.r.inflight)-1] }()
		}
		for _, o := range during {
			l.r.runDuring(o)
		}
	}
	if errors.Is(err, errSimLost) {
		// A reply lost: answered as the limiter answers a store failure,
		// by the failure mode (deny), a refund admitted. (A failure the
		// limiter met itself, a part's, it answered already.)
		for i := range hits {
			v[i] = limiter.Verdict{FailureVerdict: true, Admitted: hits[i].Refund, ResetAfter: limiter.FailureRetry}
		}
	}
	return v, err
}

// decide decides hits on the Split. A request with parts on two stores
// (the main one and the per-second one, or on a Cluster the rule's node and
// the other's) is decided in two calls at once, and a part given back when
// the other denies is given back by a third: it waits for each call to
// land, so that the schedule replays exactly, and when the schedule says so
// (simSlowPart), the other part answers after other events, run once the
// main store's part has landed.
func (l simLedger) decide(ctx context.Context, hits []limiter.Hit) ([]limiter.Verdict, error) {
	r := l.r
	var second, other []int
	for i := range hits {
		if hits[i].Window == time.Second || isKey(hits[i].Key, simOtherKey) {
			second = append(second, i)
		} else {
			other = append(other, i)
		}
	}
	if len(second) == 0 || len(other) == 0 {
		return l.split.Decide(ctx, hits)
	}
	// A part whose cost the limit can never hold is answered without a
	// call, unless it gives back. Its charges are of one key: one demand,
	// their costs added.
	sent := func(part []int) int {
		var cost uint64
		for _, i := range part {
			if hits[i].Refund {
				return 1
			}
			cost += hits[i].Cost
		}
		h := &hits[part[0]]
		capacity := h.Limit
		if h.Algorithm == config.GCRA {
			capacity = bucket(h.Burst, h.Limit)
		}
		if cost <= uint64(capacity) {
			return 1
		}
		return 0
	}
	mainSent, secondSent := sent(other), sent(second)
	// The schedule's slow per-second store holds a request of the rule's
	// hit and the per-second one (simRun.request), both sent.
	var during []simOp
	if len(second) == 1 && second[0] == len(hits)-1 && mainSent+secondSent == 2 {
		during, r.slowPart = r.slowPart, nil
	}
	mainAt, secondAt := r.gate.count(), r.slowGate.count()
	mainCall, secondCall := mainAt, secondAt // the parts' calls, when sent
	// GCRA's bucket before the call: a denied request's give-back leaves it
	// as it found it (checked below when nothing else ran meanwhile).
	tatBefore := r.gcraTAT()
	// A request whose other part answers after other events: the rule
	// key's charges meanwhile (since), and the TAT before them had the
	// request never come.
	var since *simSinceCharge
	var tatWithout int64
	release := func() {}
	if during != nil {
		release = r.slowGate.parkNext()
	}
	var v []limiter.Verdict
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		v, err = l.split.Decide(ctx, hits)
	}()
	if r.leaving && r.partsLanded != nil {
		r.slowGate.await(secondAt+secondSent, false)
		close(r.partsLanded)
	}
	if during != nil {
		r.slowGate.await(math.MaxInt, true)
		r.gate.await(mainAt+1, false)
		r.backLanded() // before the charge: the store applies a refund first
		if r.gate.deniedBy(mainCall) {
			// The store denied the rule's hit as the part landed: checked
			// at the state it was decided at, before the events.
			r.logf("  the rule's part denied at the store, checked before the events")
			if v := r.denied(r.rulesCost(hits)); v != "" && r.violation == "" {
				r.violation = v
			}
		}
		if r.gate.chargedBy(mainCall) { // the rule's hit alone, landed
			r.charged(r.rulesCost(hits))
			r.pendingFor, _ = ctx.Value(simRequestKey{}).(*limiter.Hit)
			if r.semantics() == config.GCRA && !slices.ContainsFunc(hits, func(h limiter.Hit) bool { return h.Refund }) && plainEvents(during) {
				tatWithout = max(tatBefore, r.gcraAt(r.now))
				since = &simSinceCharge{}
				r.sinceCharge = since
			}
		}
		r.partBusy = true
		for _, o := range during {
			r.runDuring(o)
		}
		r.partBusy = false
		r.sinceCharge = nil
		r.answeredLate = true       // after the events' own requests
		mainAt = r.gate.count() - 1 // the events' calls landed too
	}
	release()
	<-done
	// Split gives back, in the background, the part of a denied request
	// that the other part's store admitted: await it.
	mainAt, secondAt = mainAt+mainSent, secondAt+secondSent
	denied := false
	for i := range v {
		denied = denied || !v[i].Admitted
	}
	if denied { // a failed part's request too
		if mainSent == 1 && r.gate.chargedBy(mainCall) {
			mainAt++
		}
		if secondSent == 1 && r.slowGate.chargedBy(secondCall) {
			secondAt++
		}
	}
	// A give-back that has not landed after simOwedWait (the limiter's own
	// timeout: it failed, or never went) leaves its charge counted, which
	// the oracle no longer knows of (unsure), and the search goes on rather
	// than wait for ever (it once did, under load, on a schedule that
	// replays clean alone).
	landed := r.slowGate.awaitFor(secondAt, simOwedWait)
	if !r.leaving { // else the rule's part is parked: leave awaits it
		landed = r.gate.awaitFor(mainAt, simOwedWait) && landed
	}
	if !landed {
		r.logf("  a denied request's give-back did not land within %v", simOwedWait)
		r.unsure()
		r.unlanded++
	}
	if landed && denied && during == nil && mainSent == 1 && r.gate.chargedBy(mainCall) && r.semantics() == config.GCRA {
		// A microsecond of rounding: a live slice's record, which the
		// give-back stops at, names the TAT it left rounded up.
		r.tatsChecked++
		if full := max(tatBefore, r.gcraAt(r.now)) + int64(r.limit); r.gcraTAT() > full && r.violation == "" {
			r.violation = fmt.Sprintf("a denied request's give-back left GCRA's TAT %v ahead of where the request found it",
				r.gcraLength(r.gcraTAT()-full))
		}
	}
	if landed && denied && since != nil && !since.unmodelled && r.violation == "" {
		// The give-back takes only what its charge still holds: the TAT
		// is at least what the charges since would have left alone, but
		// for a microsecond of rounding (the token names the TAT its
		// charge left in whole microseconds).
		r.tatsChecked++
		w := int64(r.rule.window / time.Microsecond) // T, in 1/limit of a microsecond
		for _, c := range since.charges {
			tatWithout = max(tatWithout, r.gcraAt(c.at)) + int64(c.units)*w
		}
		if now := r.gcraAt(r.now); max(r.gcraTAT(), now)+int64(r.limit) < max(tatWithout, now) {
			r.violation = fmt.Sprintf("a denied request's give-back left GCRA's TAT %v behind where it would be had the request never come",
				r.gcraLength(max(tatWithout, now)-max(r.gcraTAT(), now)))
		}
	}
	return v, err
}

// answer checks an admitted request's remaining where it is exact: a
// fixed window's through one instance, whose answers are what they would
// be without slices (docs/reliability.md, "Hot keys"): the limit less what
// the window holds. Not where the instance cannot know it: a lease on its
// way, another store or slot, RLQS, or what the oracle does not know of;
// nor past the limit, after a cost recorded beyond it (Redis answers 0
// left, however far past: the slices' held units then count as remaining).
func (r *simRun) answer(remaining uint64) string {
	if r.rule.alg != config.FixedWindow || r.rule.instances > 1 || len(r.envoys) > 0 || r.rule.perSecond+r.rule.otherSlot > 0 ||
		len(r.inflight) > 0 || r.now.Before(r.unsureUntil) || len(r.faults) > 0 || len(r.reloads) > 0 {
		return ""
	}
	if n := len(r.debts); n > 0 && r.debts[n-1].at.After(r.now.Add(-r.rule.window)) {
		return ""
	}
	r.answersChecked++
	want := uint64(r.limit) - min(uint64(r.limit), r.count())
	if remaining != want {
		return fmt.Sprintf("answered remaining %d where the window holds %d of %d", remaining, r.count(), r.limit)
	}
	return ""
}

// simLeaseTop is an RLQS lease of GCRA time: the TAT it left and its units.
type simLeaseTop struct {
	tat   int64
	units uint64
}

// refundLeftLeases checks a client's GCRA refund at the store, the TAT
// before it tatBefore: it leaves the time the live RLQS leases' units take
// from now, each up to the TAT it left (a unit's time is a window's length
// in 1/limit of a microsecond; a microsecond of rounding aside: a record
// names its TAT rounded up), whose Envoys still spend them whoever's units
// the client names.
func (r *simRun) refundLeftLeases(tatBefore int64) string {
	r.tatsChecked++
	now := r.gcraAt(r.now)
	top, leased := now, int64(0)
	for _, l := range r.leaseTops {
		if l.tat > now {
			top, leased = max(top, l.tat), leased+min(int64(l.units)*int64(r.rule.window/time.Microsecond), l.tat-now)
		}
	}
	floor := min(top, now+leased)
	if after := max(r.gcraTAT(), now); after+int64(r.limit) < min(tatBefore, floor) { // no key: full now
		return fmt.Sprintf("a refund took %v of the time of a live RLQS lease's units", r.gcraLength(min(tatBefore, floor)-after))
	}
	return ""
}

// gcraAt is t as a GCRA TAT of the rule (gcraTAT).
func (r *simRun) gcraAt(t time.Time) int64 { return t.UnixMicro() * int64(r.limit) }

// gcraLength is d, a difference of GCRA TATs, as a duration.
func (r *simRun) gcraLength(d int64) time.Duration {
	return time.Duration(d/int64(r.limit)) * time.Microsecond
}

// gcraTAT is the rule's GCRA bucket's TAT, exact, in 1/limit of a Unix
// microsecond (its key's value, "<whole>:<remainder>[/<generation>]",
// as gcra.lua keeps it), 0 for no key: a full bucket.
func (r *simRun) gcraTAT() int64 {
	if r.semantics() != config.GCRA {
		return 0
	}
	v, err := r.st.m.Get(r.key(simKeyName, r.rule.window))
	if err != nil {
		return 0
	}
	whole, rest, _ := strings.Cut(v, ":")
	rest, _, _ = strings.Cut(rest, "/")
	w, _ := strconv.ParseInt(whole, 10, 64)
	f, _ := strconv.ParseInt(rest, 10, 64)
	if f >= int64(r.limit) { // written under another limit: gcra.lua rounds it up
		w, f = w+1, 0
	}
	return w*int64(r.limit) + f
}

// failing reports, once, the failure the schedule asked of a store call:
// the n-th from the event (the second of a report's, say).
func (r *simRun) failing() error {
	if r.failCall == 0 {
		return nil
	}
	if r.failCall--; r.failCall > 0 {
		return nil
	}
	r.logf("  the call failed on its way")
	r.unsure()
	return errSimFailed
}

// Numbers runs the shares' calls, each of which may fail on its way or
// lose its reply.
func (l simLedger) Numbers(ctx context.Context, c limiter.Call) ([]uint64, error) {
	if s := l.r.sinceCharge; s != nil {
		s.unmodelled = true
	}
	if err := l.r.failing(); err != nil {
		return nil, err
	}
	n, err := l.split.Numbers(ctx, c)
	if err = l.r.acknowledge(0, nil, err); err != nil {
		return nil, err
	}
	return n, nil
}

func (l simLedger) GiveBack(ctx context.Context, returns []limiter.Return) (uint64, error) {
	if s := l.r.sinceCharge; s != nil {
		s.unmodelled = true
	}
	if err := l.r.failing(); err != nil {
		return 0, err
	}
	n, err := l.split.GiveBack(ctx, returns)
	for _, ret := range returns {
		if isKey(ret.Hit.Key, simKeyName) {
			delete(l.r.leaseTops, ret.Token) // failed or not: its record may be gone
		}
	}
	if err == nil && l.r.rule.alg == config.SlidingWindowLog {
		for _, ret := range returns {
			if !isKey(ret.Hit.Key, simKeyName) {
				continue // another key's slice, whose token may be the same
			}
			if l.r.givenBack == nil {
				l.r.givenBack = map[int64]uint64{}
			}
			l.r.givenBack[ret.Token] += ret.Units
		}
	}
	if err = l.r.acknowledge(0, nil, err); err != nil {
		return 0, err
	}
	return n, nil
}

func (l simLedger) Reset(ctx context.Context, h limiter.Hit) (int64, error) {
	if s := l.r.sinceCharge; s != nil {
		s.unmodelled = true
	}
	n, err := l.split.Reset(ctx, h)
	if err = l.r.acknowledge(0, nil, err); err != nil {
		return 0, err
	}
	return n, nil
}

// acknowledge records a store call that applied: a replica's history, and
// the lost reply the schedule asked for.
func (r *simRun) acknowledge(charged uint64, lease *simLeaseRef, err error) error {
	if err != nil {
		return err
	}
	r.applied = true
	r.wrote(charged, lease)
	if r.loseReply {
		r.loseReply = false
		r.logf("  the reply was lost")
		r.unsure()
		return errSimLost
	}
	return nil
}

// wrote records a write that applied, which charged units (or took
// lease), in the replica's history.
func (r *simRun) wrote(charged uint64, lease *simLeaseRef) {
	w := simWrite{charged: charged, lease: lease}
	if r.failovers > 0 {
		w.keys = r.st.snapshot(r.now) // what a failover to come restores
	}
	r.writes = append(r.writes, w)
	if len(r.writes) > 8 {
		r.writes = slices.Delete(r.writes, 0, len(r.writes)-8)
	}
}

// newSimRun readies s's run on st; tracing keeps its trace.
func newSimRun(st *simStore, s simSchedule, tracing bool) *simRun {
	for _, m := range []*miniredis.Miniredis{st.m, st.ms, st.mo} {
		m.FlushAll()
		m.SetTime(simEpoch)
	}
	for _, g := range []*simGate{st.gate, st.gateS, st.gateC, st.gateO} {
		g.reset()
	}
	r := &simRun{st: st, rule: s.rule, limit: s.rule.limit, now: simEpoch, ops: s.ops, tracing: tracing, pending: -1, main: st.lim, gate: st.gate, slowGate: st.gateS}
	if s.rule.cluster {
		r.main, r.gate = st.cluster, st.gateC
	}
	if s.rule.otherSlot > 0 {
		r.slowGate = st.gateO
	}
	r.writes = []simWrite{{}}
	for _, o := range s.ops {
		if o.kind == simFailover {
			r.failovers++
		}
	}
	for i := range s.rule.instances {
		// Slices of any size that decides a hit: the lease's invariants are
		// searched where the cost policy (pays) would not lease.
		opts := &SliceOptions{Threshold: 2, HitsToPay: 1, Now: func() time.Time { return r.now }, Observe: SliceObserver{
			Local:  func(n int) { r.local += n },
			Leased: func(n uint64) { r.leased += n },
		}}
		sl := newSlices(simLedger{r: r, split: limiter.NewSplit(r.main, st.second)}, opts, false)
		sl.later = func(d time.Duration, f func()) {
			r.gather[i], r.due[i] = f, r.now.Add(d)
		}
		sl.spawn = func(f func()) { f() }
		sl.await = func(context.Context, chan struct{}) {} // a lease answers when the schedule says
		r.slices = append(r.slices, sl)
		r.gather = append(r.gather, nil)
		r.due = append(r.due, time.Time{})
	}
	r.alloc = rlqs.New(simLedger{r: r, split: limiter.NewSplit(r.main, st.second), rlqs: true}, &rlqs.Options{Now: func() time.Time { return r.now }})
	for i := range s.rule.envoys {
		r.envoys = append(r.envoys, &simEnvoyBucket{lease: rlqs.Bucket{Member: fmt.Sprint("envoy-", i)}, seen: 1})
	}
	for _, e := range r.envoys {
		r.report(e)
	}
	return r
}

// simEnvoyBucket is one Envoy's RLQS bucket as Envoy runs it: a token
// bucket refilled continuously, capped, starting full when its assignment
// changes; denying once its assignment expired (the bucket's expired
// assignment behavior, deny).
type simEnvoyBucket struct {
	lease    rlqs.Bucket
	held     rlqs.Assignment
	received time.Time
	tokens   float64
	refilled time.Time
	seen     uint64 // requests since the last report
	buckets  []simBucketLife
}

// simBucketLife is a token bucket an Envoy started: its first fill is the
// published bound's own term (docs/rlqs.md), counted while it lives and a
// window after.
type simBucketLife struct {
	end   time.Time // zero: live
	first uint64
}

// envoyServe lets n requests through Envoy e's bucket now.
func (r *simRun) envoyServe(e *simEnvoyBucket, n uint64) uint64 {
	live := e.held.Kind == rlqs.TokenBucket && r.now.Before(e.received.Add(e.held.TTL))
	if live {
		rate := float64(e.held.TokensPerFill) / e.held.FillInterval.Seconds()
		e.tokens = min(float64(e.held.MaxTokens), e.tokens+rate*r.now.Sub(e.refilled).Seconds())
	}
	e.refilled = r.now
	var admitted uint64
	for range n {
		e.seen++
		if live && e.tokens >= 1 {
			e.tokens--
			admitted++
		}
	}
	return admitted
}

// report sends Envoy e's report to the allocator and applies the answer.
func (r *simRun) report(e *simEnvoyBucket) {
	lim := rlqs.Limit{Hits: []limiter.Hit{r.hit(0)}, ShareKey: r.key(simKeyName, r.rule.window) + ":rlqs"}
	a, err := r.alloc.Report(context.Background(), &e.lease, lim, e.seen)
	if err != nil {
		return // the held assignment runs out at its time to live
	}
	r.logf("  report: %+v", a)
	e.seen = 0
	r.envoyServe(e, 0) // refilled up to now under the old assignment
	if a.Kind == rlqs.TokenBucket && (e.held.Kind != rlqs.TokenBucket || e.held.MaxTokens != a.MaxTokens ||
		e.held.TokensPerFill != a.TokensPerFill || e.held.FillInterval != a.FillInterval ||
		!r.now.Before(e.received.Add(e.held.TTL))) {
		e.tokens = float64(a.MaxTokens)
		e.endBucket(r.now)
		e.buckets = append(e.buckets, simBucketLife{first: a.MaxTokens})
	} else if a.Kind != rlqs.TokenBucket {
		e.endBucket(r.now)
	}
	e.held, e.received = a, r.now
	_ = r.alloc.Confirm(context.Background(), &e.lease, lim)
}

func (e *simEnvoyBucket) endBucket(now time.Time) {
	if n := len(e.buckets); n > 0 && e.buckets[n-1].end.IsZero() {
		e.buckets[n-1].end = now
	}
}

// close drops the instances without giving back: the next schedule
// flushes the store.
// logf adds a line to the trace, when it is kept: the search alone does
// not spend its time formatting lines nobody reads.
func (r *simRun) logf(format string, args ...any) {
	if r.tracing {
		r.trace = append(r.trace, fmt.Sprintf(format, args...))
	}
}

func (r *simRun) close() {
	for _, s := range r.slices {
		s.closed.Store(true)
		s.cancel()
	}
}

// run runs the schedule to its end or its first violation.
func (r *simRun) run() (violation string) {
	defer r.close()
	for r.next < len(r.ops) {
		o := r.ops[r.next]
		r.next++
		if o.kind == simLeases {
			n := min(int(o.n), len(r.ops)-r.next)
			r.during = r.ops[r.next : r.next+n]
			r.next += n
		}
		if v := r.apply(o); v != "" {
			return v
		}
		if r.violation != "" {
			return r.violation
		}
	}
	return ""
}

// leave decides a request of hits whose caller stops waiting while its
// call is on its way (simOp.leaves): parked at the store (a request of
// parts: its rule's part, once the other part's call landed), the caller's
// context ends, the limiter answers the caller (by the failure mode), and
// the call lands after, then a lease it took is settled by the limiter
// (Limiter.orphanedLeases), which the run waits for. Envoy let the request
// through by the failure mode: what the store charged is admitted, but a
// seat, which the settlement freed. mainAt is the main store's calls
// before the request. When no call went (one failed on its way), the
// caller had its answer before it could leave: leave returns it, and gone
// false.
func (r *simRun) leave(inst int, req decision.Request, mainAt int) (v []limiter.Verdict, gone bool, violation string) {
	hits := req.Hits
	ctx, cancel := context.WithCancel(simRequest(context.Background(), hits))
	defer cancel()
	release := r.gate.parkNext()
	done := make(chan struct{})
	r.leaving, r.partsLanded = true, nil
	if r.parted(hits) {
		r.partsLanded = make(chan struct{})
	}
	go func() {
		defer close(done)
		v, _ = r.slices[inst].Decide(ctx, req) // a failure is in v
	}()
	parked := r.gate.awaitParked(done)
	if parked && r.partsLanded != nil {
		<-r.partsLanded
	}
	cancel()
	<-done
	r.leaving = false
	release()
	if !parked {
		return v, false, ""
	}
	r.logf("  the caller left while its call was on its way")
	r.left++
	if r.parted(hits) {
		r.leftParts++
	}
	landed, charged := r.gate.awaitParkedPass()
	if !landed {
		// Refused unrun (its function library lost in a restart): a call
		// whose caller left is not sent again (none of these has a late
		// form: no settlement, no recorded cost).
		r.logf("  refused unrun, not sent again")
		r.backOwed = 0
		return nil, true, ""
	}
	r.backLanded()
	if !charged {
		r.wrote(0, nil) // a refund's, maybe
		return nil, true, ""
	}
	if r.rule.seats {
		// The limiter settles the lease no one holds. (Neither write
		// holds units the oracle counts.)
		r.wrote(0, nil)
		r.gate.await(mainAt+2, false)
		r.wrote(0, nil)
		r.logf("  its seat settled by the limiter")
		return nil, true, ""
	}
	cost := r.rulesCost(hits)
	r.wrote(cost, nil) // a failover may lose it, as any other
	r.logf("  charged: let through by the failure mode")
	return nil, true, r.admit(cost, simByStore, r.parted(hits))
}

// owed decides h, a call owed to the store (a settlement, a recorded
// cost), for o, and returns its verdicts when its caller had them;
// r.applied then says whether the store applied it, its reply lost or not. When o leaves, its caller left before the call went:
// the limiter answers at once and sends the call all the same (its late
// form), which the run awaits, unless the call failed on its way; never
// sent, it returns a violation that says what stays wrong.
func (r *simRun) owed(o simOp, h limiter.Hit, unsent string) ([]limiter.Verdict, string) {
	r.applied = false
	if !o.leaves {
		v, _ := r.slices[o.inst].Decide(context.Background(), plain(h))
		return v, ""
	}
	left, cancel := context.WithCancel(context.Background())
	cancel()
	mainAt, fails := r.gate.count(), r.failCall == 1
	_, _ = r.slices[o.inst].Decide(left, plain(h))
	if fails {
		return nil, ""
	}
	if r.applied {
		// Acknowledged before it landed: what a failover restores is the
		// store after it.
		r.writes = r.writes[:len(r.writes)-1]
	}
	if !r.gate.awaitFor(mainAt+1, simOwedWait) {
		return nil, simNeverSent + ": " + unsent
	}
	r.wrote(h.Cost, nil)
	r.logf("  its caller left before the call went; the call landed after")
	r.applied, r.left = true, r.left+1
	return nil, ""
}

// backLanded cancels the refund the request being decided carries: the
// store applied it, whatever the request's fate.
func (r *simRun) backLanded() {
	if r.backOwed > 0 {
		r.logf("  %d refunded at the store", r.backOwed)
		r.cancel(r.backOwed, simByStore)
		r.backOwed = 0
	}
}

// runDuring runs o while a call is on its way (see simHold), keeping the
// first violation it finds for run to return.
func (r *simRun) runDuring(o simOp) {
	if v := r.apply(o); v != "" && r.violation == "" {
		r.violation = v
	}
}

// apply runs one event; it returns the violation it caused, if any.
func (r *simRun) apply(o simOp) string {
	r.logf("%6.3fs %v", r.now.Sub(simEpoch).Seconds(), o)
	ctx := context.Background()
	switch o.kind {
	case simHit:
		req := r.request(o)
		hits := req.Hits
		mainAt := r.gate.count()
		if r.rule.seats { // two descriptors of the rule (twice) ask for one lease
			for i := range hits {
				if isKey(hits[i].Key, simKeyName) {
					hits[i].Lease, hits[i].LeaseTTL, req.Routes[i].NoSlices = true, r.rule.leaseTTL, true
				}
			}
		}
		local := r.local
		r.answeredLate = false
		var v []limiter.Verdict
		// Only a request that goes to the store whatever the slices hold
		// (a refund in it after all, two hits on the key, a seat) leaves:
		// the call that parks is its own.
		// A request of parts leaves with its rule's part on the way, unless
		// that part is the one a slow other part waits for (simSlowPart).
		if o.leaves && !r.partBusy && (r.slowPart == nil || !r.parted(hits)) && (r.rule.seats || o.twice || r.backOwed > 0) {
			var gone bool
			var violation string
			if v, gone, violation = r.leave(o.inst, req, mainAt); gone {
				return violation
			}
		} else {
			v, _ = r.slices[o.inst].Decide(simRequest(ctx, hits), req) // a part's failure is in v (see below)
		}
		if r.gate.count() > mainAt { // the call carrying its refund landed
			r.backLanded()
		}
		r.backOwed = 0
		from := simByStore
		if r.local > local {
			from = simBySlice
		}
		last := len(v) - 1 // the other part's, when there is one
		if r.pending >= 0 && r.pendingFor == &hits[0] {
			// Charged before the answer: settled by the answer.
			r.logf("  charged at %.3fs: %+v", r.admitted[r.pending].at.Sub(simEpoch).Seconds(), v)
			// The other part's failure answers by its failure mode (see below).
			return r.answered(v[0].Admitted && !v[0].FailureVerdict && v[last].Admitted)
		}
		if len(v) > 1 && !isKey(hits[last].Key, simKeyName) {
			r.logf("  other part: admitted %v (failure verdict %v), remaining %d", v[last].Admitted, v[last].FailureVerdict, v[last].Remaining)
			// A part that failed answers by its failure mode: admitted (the
			// default), the request is, and the rule's charge stands.
			if !v[last].Admitted {
				break
			}
		}
		// A request the store admitted: one whose other part failed, and
		// answered by its failure mode (allow), among them (err is then
		// that part's).
		admitted := len(v) > 0 && v[0].Admitted && !v[0].FailureVerdict
		if admitted && r.rule.seats {
			r.logf("  seat %d acquired, remaining %d", len(r.seats), v[0].Remaining)
			r.seats = append(r.seats, simSeat{id: v[0].Lease, units: o.n, ends: r.now.Add(r.rule.leaseTTL)})
			return r.admitSeat()
		}
		if admitted {
			r.logf("  admitted, remaining %d", v[0].Remaining)
			if v := r.admit(o.n, from, r.parted(hits)); v != "" {
				return v
			}
			if !o.twice {
				return r.answer(v[0].Remaining)
			}
			return ""
		}
		if len(v) > 0 && !v[0].Admitted && !v[0].FailureVerdict && !v[0].CostExceedsLimit {
			r.logf("  denied: %+v", v[0])
			if r.answeredLate {
				return "" // decided before the events its other part let run: not checkable now
			}
			return r.denied(o.n)
		}
	case simRefund:
		// A client refunds only units it was admitted: at most what the
		// oracle holds uncancelled in the window the refund reaches.
		n := min(o.n, r.refundable())
		if n == 0 {
			return ""
		}
		h := r.hit(n)
		h.Refund = true
		r.applied = false
		local, tatBefore := r.local, r.gcraTAT()
		_, err := r.slices[o.inst].Decide(ctx, plain(h))
		if err == nil && r.local == local && len(r.leaseTops) > 0 {
			if v := r.refundLeftLeases(tatBefore); v != "" {
				return v
			}
		}
		switch {
		case r.local > local:
			// Units the slices spent before a Reset or a restart are no
			// longer counted, but are spent again: what the restart
			// granted grows by them.
			r.logf("  %d given back to the instance's slices", n)
			if left := r.cancel(n, simBySlice); left > 0 {
				r.faults = append(r.faults, simFault{at: r.now, units: left})
			}
		case r.applied || err == nil: // its reply lost or not
			r.logf("  %d refunded at the store", n)
			r.cancel(n, simByStore)
		}
	case simSettle:
		// The client settles a lease it holds (a seat held past its time
		// to live frees nothing: it left the count by itself).
		var held []int
		for i := range r.seats {
			if !r.seats[i].settled {
				held = append(held, i)
			}
		}
		if len(held) == 0 {
			return ""
		}
		i := held[int(o.n)%len(held)]
		h := r.hit(o.cost)
		h.Settle = r.seats[i].id
		if _, v := r.owed(o, h, "its seat stays held"); v != "" || !r.applied {
			return v
		}
		r.seats[i].settled = true
		// The actual cost counts in its window, even past the limit.
		r.record(simAdmission{units: o.cost})
	case simRecord:
		h := r.hit(o.n)
		h.Record = true
		verdicts, v := r.owed(o, h, "a spent cost is not counted")
		if v != "" || !r.applied {
			return v
		}
		// Counted in its window, even past the limit: a debt the store
		// denies the next hits for. Recorded past it (its caller left:
		// maybe), it lets the window hold its units more than the limit:
		// what was admitted before it in the store (a part's charge
		// answered after it, a slice leased before it) may be spent or
		// answered after it.
		r.record(simAdmission{units: o.n})
		if len(verdicts) == 0 || !verdicts[0].Admitted {
			r.debts = append(r.debts, simFault{at: r.now, units: o.n})
		}
		r.recorded++
	case simEnvoy:
		if n := r.envoyServe(r.envoys[o.inst], o.n); n > 0 {
			r.byBuckets += n
			r.logf("  %d admitted by its bucket", n)
			return r.admit(n, simByBucket, false)
		}
	case simAdvance:
		r.advance(o.d)
	case simLeases:
		r.sendLeases(o.inst)
		r.during = nil
	case simReset:
		// Other instances' slices live on: the log keeps their members
		// (recorded ahead), the other algorithms' counts forget them, and
		// each unit they held is then spent or given back uncounted.
		// The Envoys' leases go with the count.
		held := r.leasedAhead()
		if r.rule.alg != config.SlidingWindowLog {
			held += r.held(o.inst)
			held += r.inflightUnits(o.inst)
		}
		r.applied, r.leaseTops = false, nil
		_, _ = r.slices[o.inst].Reset(ctx, r.hit(0))
		if r.applied { // its reply lost or not
			r.keepSliceMembers(o.inst)
			r.since, r.seatsFrom, r.sinceAt = len(r.admitted), len(r.seats), r.now
			r.debts = nil // the store holds them no more
			r.faults = append(r.faults, simFault{at: r.now, units: held})
		}
	case simReloadOp:
		r.leaseTops = nil // TATs of another limit's scale
		r.reloads = append(r.reloads, simReload{at: r.now, from: r.limit})
		r.limit = uint32(o.n)
	case simLoseReply:
		r.loseReply = true
	case simFailCall:
		r.failCall = int(o.n)
	case simHold:
		r.hold = int(o.n)
	case simSlowPart:
		n := min(int(o.n), len(r.ops)-r.next)
		r.slowPart = slices.Clone(r.ops[r.next : r.next+n])
		r.next += n
		if o.fails { // the parked call fails once let go
			r.slowGate.mu.Lock()
			r.slowGate.failKey = simOtherKey
			r.slowGate.mu.Unlock()
		}
	case simFailSlot:
		r.slowGate.mu.Lock()
		r.slowGate.failKey = simOtherKey
		r.slowGate.mu.Unlock()
	case simFailover:
		r.leaseTops = nil // a lease's record lost, or a give-back's undone
		r.failovers--
		n := min(int(o.n), len(r.writes)-1)
		var lost uint64
		var spent []*slice
		for _, w := range r.writes[len(r.writes)-n:] {
			// A lost lease adds the units its live slice spends: what it
			// gives back the store no longer holds (its record, or its log
			// members, went with it). Else every unit it charged.
			if w.lease != nil {
				if sl := r.slice(w.lease); sl != nil {
					spent = append(spent, sl)
					continue
				}
			}
			lost += w.charged
		}
		r.writes = r.writes[:len(r.writes)-n]
		r.st.restore(r.writes[len(r.writes)-1].keys, r.now)
		if r.pending >= 0 {
			// A request's part charged but not answered is not among the
			// acknowledged writes: the replica promoted lacks it.
			a := &r.admitted[r.pending]
			lost += a.units - a.refunded
			a.refunded = a.units
		}
		r.faults = append(r.faults, simFault{at: r.now, units: lost, spent: spent})
		r.unsure() // a give-back lost with the writes leaves its charge
	case simRestart:
		r.leaseTops = nil
		r.st.m.FlushAll()
		r.st.lua.Flush()
		r.writes = []simWrite{{}}
		r.keptMembers = nil
		r.since, r.seatsFrom, r.sinceAt, r.restartAt = len(r.admitted), len(r.seats), r.now, r.now
		r.debts = nil // the store holds them no more
		// The live slices' units are still spent, and no longer counted.
		// A request whose other part is still to answer gives back what
		// its main part charged if that part denies: the counter it takes
		// from holds only what was charged after the restart.
		var owed uint64
		if r.pending >= 0 {
			owed = r.admitted[r.pending].units - r.admitted[r.pending].refunded
		}
		r.faults = append(r.faults, simFault{at: r.now, units: r.held(-1) + r.leasedAhead() + r.inflightUnits(-1) + owed})
	}
	return ""
}

// simInflight is a lease written, its answer on its way to inst.
type simInflight struct {
	units uint64
	inst  int
}

// inflightUnits is the units of the leases on their way but to except.
func (r *simRun) inflightUnits(except int) uint64 {
	var n uint64
	for _, l := range r.inflight {
		if l.inst != except {
			n += l.units
		}
	}
	return n
}

// leasedAhead is the refills the Envoys' buckets were leased ahead.
func (r *simRun) leasedAhead() uint64 {
	var n uint64
	for _, e := range r.envoys {
		if ahead := e.lease.LeasedAhead(r.now); ahead > 0 {
			n += ahead + 1
		}
	}
	return n
}

// simKept is units a log's Reset kept of a live slice of inst's: their
// members are recorded at at.
type simKept struct {
	inst  int
	units uint64
	at    time.Time
}

// keepSliceMembers records, at a Reset of the log at inst, the units the
// other instances' slices spent before it whose members are still ahead:
// the Reset keeps them, and they count as long as the log holds them. A
// live slice's unused units are the slices' held; an ended one's (its
// members recorded ahead until its period's end) are given back, or on
// their way (the slices' returns, held too). inst's own slices end, and
// their members go by name.
func (r *simRun) keepSliceMembers(inst int) {
	if r.rule.alg != config.SlidingWindowLog {
		return
	}
	for token, k := range r.keptMembers {
		if k.inst == inst {
			delete(r.keptMembers, token)
		}
	}
	keep := func(i int, token int64, units uint64, at time.Time) {
		if units == 0 || !at.After(r.now) {
			return
		}
		if r.keptMembers == nil {
			r.keptMembers = map[int64]simKept{}
		}
		r.keptMembers[token] = simKept{inst: i, units: units, at: at}
	}
	for i, s := range r.slices {
		if i == inst {
			continue
		}
		s.each(func(k *hotKey) {
			if !isKey(k.rule.Key, simKeyName) {
				return // the Reset is the rule's key's; another key's slice may have the same token
			}
			for _, sl := range k.slices {
				if sl.live(r.now) {
					keep(i, sl.token, sl.used, sl.expires)
				}
			}
			for _, rec := range k.recorded {
				units := rec.all.Units - min(rec.all.Units, r.givenBack[rec.all.Token])
				for _, ret := range s.returns {
					if ret.Token == rec.all.Token {
						units -= min(units, ret.Units)
					}
				}
				keep(i, rec.all.Token, units, time.UnixMicro(rec.all.Token))
			}
		})
	}
}

// held is the units the slices of every instance but except hold: live,
// or ended and waiting for the next tick to be given back.
func (r *simRun) held(except int) uint64 {
	var n uint64
	for i, s := range r.slices {
		if i == except {
			continue
		}
		s.each(func(k *hotKey) { n += k.available(r.now) })
		for _, ret := range s.returns {
			n += ret.Units
		}
	}
	return n
}

// sendLeases sends inst's gathered leases, if any.
func (r *simRun) sendLeases(inst int) {
	if f := r.gather[inst]; f != nil {
		r.gather[inst] = nil
		if r.during == nil && r.hold > 0 {
			n := min(r.hold, len(r.ops)-r.next)
			r.during, r.hold = r.ops[r.next:r.next+n], 0
			r.next += n
		}
		f()
		// No lease went (nothing left to lease): the events held run now,
		// not inside another call, whose answer they would delay.
		if during := r.during; during != nil {
			r.during = nil
			for _, o := range during {
				r.runDuring(o)
			}
		}
	}
}

// advance moves the clock d: every instance ticks at each whole second it
// passes, and leases whose gathering ended go.
func (r *simRun) advance(d time.Duration) {
	end := r.now.Add(d)
	for {
		next := r.now.Truncate(time.Second).Add(time.Second)
		for i := range r.due {
			if r.gather[i] != nil && !r.partBusy && r.due[i].Before(next) && !r.due[i].After(end) {
				next = r.due[i]
				if next.Before(r.now) { // due while a lease's events ran
					next = r.now
				}
			}
		}
		if next.After(end) {
			break
		}
		r.setNow(next)
		if r.partBusy {
			// The per-second store is slow, and every call to it waits
			// behind the one parked there: the instances' leases and ticks
			// wait too (a tick passed meanwhile is skipped).
			continue
		}
		for i := range r.gather {
			if r.gather[i] != nil && !r.due[i].After(r.now) {
				r.sendLeases(i)
			}
		}
		if r.now.Truncate(time.Second).Equal(r.now) {
			for _, s := range r.slices {
				s.turn(r.now)
				s.flush()
			}
		}
		if r.now.Truncate(rlqs.DefaultReportInterval).Equal(r.now) {
			for _, e := range r.envoys {
				r.report(e)
			}
		}
	}
	// Events run while a lease was on its way may have moved the clock
	// past end: it never goes back.
	if r.now.Before(end) {
		r.setNow(end)
	}
}

func (r *simRun) setNow(t time.Time) {
	r.now = t
	r.st.m.SetTime(t)
	r.st.ms.SetTime(t)
	r.st.mo.SetTime(t)
}
