package e2e

// Redis Cluster and Sentinel deployments of the test's own, on free loopback
// ports, for the cluster, sentinel and failover tests. Like startRedis, they
// fail (never skip) when the Redis binaries are missing.

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/netproxy"
)

// freePorts returns n distinct free loopback ports (freePort).
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	for range n {
		ports = append(ports, freePort(t))
	}
	return ports
}

func lookPath(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		pkg := name
		if name == "redis-cli" {
			pkg = "redis-tools (a dependency of redis-server)"
		}
		t.Fatalf("%s is not on PATH: install Debian's %s package (make test, or make tools, does)", name, pkg)
	}
	return path
}

// redisProc is one redis-server or redis-sentinel process.
type redisProc struct {
	name   string // what the failure report calls it
	port   int    // the process's own port
	addr   string // the address clients use: the process's, or its proxy's
	cmd    *exec.Cmd
	out    *syncBuffer
	exited chan struct{}
	proxy  *netproxy.Proxy // nil when clients connect directly
	client *redis.Client
}

// startProc runs path with args; t.Cleanup kills it and, when the test
// failed, shows the end of its output.
func startProc(t *testing.T, name, path string, port int, args ...string) *redisProc {
	t.Helper()
	p := &redisProc{name: name, port: port, addr: "127.0.0.1:" + strconv.Itoa(port), out: &syncBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(path, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		// Every node is killed, by a test or at cleanup: its exit status
		// says only that. alive() and the output tell the rest.
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.kill()
		if p.client != nil {
			_ = p.client.Close() // the test's outcome is decided
		}
		if t.Failed() {
			out := p.out.String()
			if len(out) > 3000 {
				out = "..." + out[len(out)-3000:]
			}
			t.Logf("%s (%s) output:\n%s", p.name, p.addr, out)
		}
	})
	return p
}

// kill sends SIGKILL and waits for the process to be gone; its proxy, if
// any, closes its listener and connections, as the process's own would.
func (p *redisProc) kill() {
	_ = p.cmd.Process.Kill() // it may have exited already; p.exited is what counts
	<-p.exited
	if p.proxy != nil {
		p.proxy.Close()
	}
}

func (p *redisProc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// redisCluster is a Redis Cluster of 3 masters with one replica each.
type redisCluster struct {
	nodes []*redisProc
	// client is the test's own cluster client.
	client *redis.ClusterClient
}

type clusterOptions struct {
	// proxied puts a proxy (startProxy) in front of every node and makes the nodes
	// announce the proxies' addresses, so that every client (the service's,
	// the test's, the replicas') goes through them. The cluster bus does
	// not.
	proxied bool
}

// startCluster starts a Redis Cluster of 6 nodes (3 masters, 3 replicas)
// with a 1 s node timeout, and waits until every slot is served and every
// replica is in sync.
func startCluster(t *testing.T) *redisCluster {
	t.Helper()
	return startClusterWith(t, clusterOptions{})
}

func startClusterWith(t *testing.T, opts clusterOptions) *redisCluster {
	t.Helper()
	server := lookPath(t, "redis-server")
	cli := lookPath(t, "redis-cli")
	const n = 6
	dir := t.TempDir()
	// Each node needs a port and a cluster bus port; the default bus port
	// (port + 10000) may not exist above 55535, so it is set explicitly.
	ports := freePorts(t, 3*n)
	c := &redisCluster{}
	started := time.Now()
	// A 1 s node timeout makes a failover take 2 to 3 s. A replica syncs
	// at once (no diskless sync delay), and a master pings its replicas
	// every second: CLUSTER SLOTS lists a replica only once its replication
	// offset has moved, which an idle master would take 10 s to do.
	for i := range n {
		port, bus, proxyPort := ports[3*i], ports[3*i+1], ports[3*i+2]
		args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, fmt.Sprintf("nodes-%d.conf", port)),
			"--cluster-node-timeout", "1000", "--cluster-port", strconv.Itoa(bus),
			"--save", "", "--appendonly", "no", "--dir", dir, "--repl-diskless-sync-delay", "0", "--repl-ping-replica-period", "1"}
		if opts.proxied {
			args = append(args, "--cluster-announce-ip", "127.0.0.1",
				"--cluster-announce-port", strconv.Itoa(proxyPort), "--cluster-announce-bus-port", strconv.Itoa(bus))
		}
		node := startProc(t, fmt.Sprintf("cluster node %d", i), server, port, args...)
		if opts.proxied {
			node.proxy = startProxy(t, proxyPort, node.addr)
			node.addr = node.proxy.Addr()
		}
		node.client = redis.NewClient(&redis.Options{Addr: node.addr, MaxRetries: -1})
		c.nodes = append(c.nodes, node)
	}
	for _, node := range c.nodes {
		waitFor(t, 5*time.Second, func() error { return node.client.Ping(context.Background()).Err() })
	}
	create := []string{"--cluster", "create"}
	for _, node := range c.nodes {
		create = append(create, "127.0.0.1:"+strconv.Itoa(node.port))
	}
	create = append(create, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command(cli, create...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	waitFor(t, 15*time.Second, c.healthy)
	c.client = redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.seeds(), MaxRetries: -1})
	t.Cleanup(func() { c.client.Close() })
	waitFor(t, 5*time.Second, func() error {
		return c.client.ForEachShard(context.Background(), func(ctx context.Context, shard *redis.Client) error {
			return shard.Ping(ctx).Err()
		})
	})
	t.Logf("redis cluster of %d nodes up in %v (proxied: %v)", n, time.Since(started).Round(time.Millisecond), opts.proxied)
	return c
}

// seeds are the addresses for --redis-cluster-url: the first three nodes.
func (c *redisCluster) seeds() []string {
	return []string{c.nodes[0].addr, c.nodes[1].addr, c.nodes[2].addr}
}

// url is the service's --redis-cluster-url, in go-redis ParseClusterURL form.
func (c *redisCluster) url() string {
	seeds := c.seeds()
	return "redis://" + seeds[0] + "?addr=" + strings.Join(seeds[1:], "&addr=")
}

// setDelay makes a proxied cluster's proxies delay everything sent to the
// nodes by d (0: none).
func (c *redisCluster) setDelay(d time.Duration) {
	for _, node := range c.nodes {
		setDelay(node.proxy, d)
	}
}

// slotRange is one line of CLUSTER SLOTS.
type slotRange struct {
	start, end int
	master     string
	replicas   []string
}

func (r slotRange) String() string {
	return fmt.Sprintf("%d-%d %s %v", r.start, r.end, r.master, r.replicas)
}

// healthy reports whether every live node says cluster_state:ok with all
// slots served, all agree on 3 masters with one replica each, and every
// replica's link to its master is up.
func (c *redisCluster) healthy() error {
	ctx := context.Background()
	var want string
	for _, node := range c.nodes {
		if !node.alive() {
			continue
		}
		info, err := node.client.ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("%s: %w", node.addr, err)
		}
		for _, field := range []string{"cluster_state:ok", "cluster_slots_ok:16384"} {
			if !strings.Contains(info, field) {
				return fmt.Errorf("%s: no %s in CLUSTER INFO", node.addr, field)
			}
		}
		ranges, err := clusterSlots(ctx, node.client)
		if err != nil {
			return fmt.Errorf("%s: %w", node.addr, err)
		}
		got := fmt.Sprint(ranges)
		if want == "" {
			want = got
		} else if got != want {
			return fmt.Errorf("nodes disagree on the slots: %s and %s", want, got)
		}
		masters := map[string]bool{}
		covered := 0
		for _, r := range ranges {
			masters[r.master] = true
			covered += r.end - r.start + 1
			if len(r.replicas) != 1 {
				return fmt.Errorf("%s: slots %d-%d have %d replicas", node.addr, r.start, r.end, len(r.replicas))
			}
		}
		if len(masters) != 3 || covered != 16384 {
			return fmt.Errorf("%s: %d masters cover %d slots", node.addr, len(masters), covered)
		}
		if role, _ := node.client.Do(ctx, "ROLE").Slice(); len(role) > 0 && role[0] == "slave" {
			repl, err := node.client.Info(ctx, "replication").Result()
			if err != nil {
				return err
			}
			if !strings.Contains(repl, "master_link_status:up") {
				return fmt.Errorf("replica %s not in sync yet", node.addr)
			}
		}
	}
	return nil
}

// clusterSlots is CLUSTER SLOTS, sorted by the first slot.
func clusterSlots(ctx context.Context, client *redis.Client) ([]slotRange, error) {
	// CLUSTER SLOTS maps each slot range to the nodes serving it and leaves
	// out failed replicas; CLUSTER SHARDS groups by shard and lists failed
	// nodes too, so it would change what the readiness and failover checks see.
	slots, err := client.ClusterSlots(ctx).Result() //nolint:staticcheck // CLUSTER SHARDS is not the same answer (above)
	if err != nil {
		return nil, err
	}
	var ranges []slotRange
	for _, s := range slots {
		if len(s.Nodes) == 0 {
			continue
		}
		r := slotRange{start: s.Start, end: s.End, master: s.Nodes[0].Addr}
		for _, n := range s.Nodes[1:] {
			r.replicas = append(r.replicas, n.Addr)
		}
		slices.Sort(r.replicas)
		ranges = append(ranges, r)
	}
	slices.SortFunc(ranges, func(a, b slotRange) int { return a.start - b.start })
	return ranges, nil
}

// live is a node that is still running, for questions to the cluster.
func (c *redisCluster) live(t *testing.T) *redisProc {
	t.Helper()
	for _, node := range c.nodes {
		if node.alive() {
			return node
		}
	}
	t.Fatal("no cluster node is running")
	return nil
}

// slots is the live cluster's CLUSTER SLOTS.
func (c *redisCluster) slots(t *testing.T) []slotRange {
	t.Helper()
	ranges, err := clusterSlots(context.Background(), c.live(t).client)
	if err != nil {
		t.Fatal(err)
	}
	return ranges
}

// masters are the masters' addresses, in the order of their first slot.
func (c *redisCluster) masters(t *testing.T) []string {
	t.Helper()
	var masters []string
	for _, r := range c.slots(t) {
		if !slices.Contains(masters, r.master) {
			masters = append(masters, r.master)
		}
	}
	return masters
}

// keySlot asks the cluster (CLUSTER KEYSLOT) for the hash slot of key.
func (c *redisCluster) keySlot(t *testing.T, key string) int {
	t.Helper()
	slot, err := c.live(t).client.ClusterKeySlot(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return int(slot)
}

// masterOf is the address of the master that serves key's slot.
func (c *redisCluster) masterOf(t *testing.T, key string) string {
	t.Helper()
	slot := c.keySlot(t, key)
	for _, r := range c.slots(t) {
		if r.start <= slot && slot <= r.end {
			return r.master
		}
	}
	t.Fatalf("slot %d of %s is not served", slot, key)
	return ""
}

// node is the process whose (announced) address is addr.
func (c *redisCluster) node(t *testing.T, addr string) *redisProc {
	t.Helper()
	for _, node := range c.nodes {
		if node.addr == addr {
			return node
		}
	}
	t.Fatalf("no cluster node at %s", addr)
	return nil
}

// kill SIGKILLs the node at addr.
func (c *redisCluster) kill(t *testing.T, addr string) {
	t.Helper()
	c.node(t, addr).kill()
}

// spread finds, for each master in order, a value whose key (keyOf(value))
// that master serves, trying prefix0, prefix1, ...; the slots come from
// CLUSTER KEYSLOT on the real key names.
func (c *redisCluster) spread(t *testing.T, prefix string, keyOf func(value string) string) []string {
	t.Helper()
	masters := c.masters(t)
	values := make([]string, len(masters))
	found := 0
	for i := 0; found < len(masters); i++ {
		if i > 1000 {
			t.Fatalf("no value %s<n> lands on each of %v", prefix, masters)
		}
		v := prefix + strconv.Itoa(i)
		m := slices.Index(masters, c.masterOf(t, keyOf(v)))
		if m >= 0 && values[m] == "" {
			values[m] = v
			found++
		}
	}
	return values
}

// startProxy puts a proxy on port (0: any) in front of a Redis node at
// target, stopped when the test ends. setDelay delays what clients send by
// d (answers are not delayed), so a command costs one round trip of d
// more.
func startProxy(t *testing.T, port int, target string) *netproxy.Proxy {
	t.Helper()
	p, err := netproxy.Start("127.0.0.1:"+strconv.Itoa(port), target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// setDelay delays what clients send through p by d.
func setDelay(p *netproxy.Proxy, d time.Duration) { p.SetDelays(d, 0) }

// redisSentinel is a master, its replica, and 3 sentinels monitoring them.
type redisSentinel struct {
	masterName string
	master     *redisProc
	replica    *redisProc
	sentinels  []*redisProc
	// link carries the replica's replication from the master: closing it
	// cuts the replica off, so that the writes the master acknowledges
	// from then on are never replicated (a lagging replica).
	link *netproxy.Proxy
}

// startSentinel starts a master, a replica of it, and 3 sentinels (quorum
// 2, down after 1 s, failover timeout 3 s), and waits until every sentinel
// names the master, knows the replica in sync and knows the 2 others.
func startSentinel(t *testing.T) *redisSentinel {
	t.Helper()
	server := lookPath(t, "redis-server")
	sentinelPath := lookPath(t, "redis-sentinel")
	dir := t.TempDir()
	started := time.Now()
	ports := freePorts(t, 6)
	s := &redisSentinel{masterName: "mymaster"}
	// No diskless sync delay (5 s by default) before the replica's sync.
	common := []string{"--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--repl-diskless-sync-delay", "0", "--repl-ping-replica-period", "1"}
	s.master = startProc(t, "master", server, ports[0],
		append([]string{"--port", strconv.Itoa(ports[0]), "--dir", t.TempDir()}, common...)...)
	s.link = startProxy(t, ports[5], s.master.addr)
	s.replica = startProc(t, "replica", server, ports[1],
		append([]string{"--port", strconv.Itoa(ports[1]), "--dir", t.TempDir(), "--replicaof", "127.0.0.1", strconv.Itoa(ports[5])}, common...)...)
	for _, p := range []*redisProc{s.master, s.replica} {
		p.client = redis.NewClient(&redis.Options{Addr: p.addr, MaxRetries: -1})
	}
	// The replica in sync before the sentinels start: their first INFO of
	// the master then lists it.
	waitFor(t, 10*time.Second, func() error {
		info, err := s.replica.client.Info(context.Background(), "replication").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "master_link_status:up") {
			return fmt.Errorf("replica not in sync")
		}
		return nil
	})
	for i, port := range ports[2:5] {
		conf := filepath.Join(dir, fmt.Sprintf("sentinel-%d.conf", port))
		writeFile(t, conf, fmt.Sprintf(`port %d
bind 127.0.0.1
dir %s
sentinel resolve-hostnames no
sentinel monitor %s 127.0.0.1 %d 2
sentinel down-after-milliseconds %s 1000
sentinel failover-timeout %s 3000
`, port, dir, s.masterName, ports[0], s.masterName, s.masterName))
		p := startProc(t, fmt.Sprintf("sentinel %d", i), sentinelPath, port, conf)
		p.client = redis.NewClient(&redis.Options{Addr: p.addr, MaxRetries: -1})
		s.sentinels = append(s.sentinels, p)
	}
	waitFor(t, 15*time.Second, func() error {
		ctx := context.Background()
		for _, p := range s.sentinels {
			sc := redis.NewSentinelClient(&redis.Options{Addr: p.addr, MaxRetries: -1})
			err := func() error {
				defer sc.Close()
				addr, err := sc.GetMasterAddrByName(ctx, s.masterName).Result()
				if err != nil {
					return fmt.Errorf("%s: %w", p.addr, err)
				}
				if got := strings.Join(addr, ":"); got != s.master.addr {
					return fmt.Errorf("%s names master %s, want %s", p.addr, got, s.master.addr)
				}
				replicas, err := sc.Replicas(ctx, s.masterName).Result()
				if err != nil {
					return err
				}
				if len(replicas) != 1 || replicas[0]["name"] != s.replica.addr ||
					replicas[0]["flags"] != "slave" || replicas[0]["master-link-status"] != "ok" {
					return fmt.Errorf("%s knows replicas %v", p.addr, replicas)
				}
				others, err := sc.Sentinels(ctx, s.masterName).Result()
				if err != nil {
					return err
				}
				if len(others) != 2 {
					return fmt.Errorf("%s knows %d other sentinels", p.addr, len(others))
				}
				return nil
			}()
			if err != nil {
				return err
			}
		}
		return nil
	})
	t.Logf("redis sentinel deployment up in %v", time.Since(started).Round(time.Millisecond))
	return s
}

// url is the service's --redis-sentinel-url, in go-redis ParseFailoverURL form.
func (s *redisSentinel) url() string {
	u := "redis://" + s.sentinels[0].addr + "?master_name=" + s.masterName
	for _, p := range s.sentinels[1:] {
		u += "&addr=" + p.addr
	}
	return u
}

// masterAddr is the master the first live sentinel names.
func (s *redisSentinel) masterAddr(t *testing.T) string {
	t.Helper()
	for _, p := range s.sentinels {
		if !p.alive() {
			continue
		}
		sc := redis.NewSentinelClient(&redis.Options{Addr: p.addr, MaxRetries: -1})
		addr, err := sc.GetMasterAddrByName(context.Background(), s.masterName).Result()
		_ = sc.Close() // asked once; its answer is in addr and err
		if err == nil {
			return strings.Join(addr, ":")
		}
	}
	t.Fatal("no sentinel answers")
	return ""
}
