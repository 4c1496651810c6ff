package limiter

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// router says where a script runs. Outside Redis Cluster every key goes to
// the one server; in a cluster, each hash slot's keys go to its master.
type router interface {
	// slot groups keys: keys with equal slots may share one script.
	slot(key string) int
	// server returns the server for keys sharing key's slot.
	server(ctx context.Context, key string) (redis.UniversalClient, error)
	// failed is told of every failed script call.
	failed(err error)
	// live lists the servers in use now.
	live(ctx context.Context) ([]redis.UniversalClient, error)
	// node returns the server at addr, which a MOVED (moved set) or ASK
	// redirection named.
	node(ctx context.Context, addr string, moved bool) (redis.UniversalClient, error)
	// close releases what the router opened itself.
	close()
}

// singleRouter sends everything to one server: standalone, Sentinel (the
// failover client follows the master) or the embedded store.
type singleRouter struct{ client redis.UniversalClient }

func (singleRouter) slot(string) int { return 0 }

func (r singleRouter) server(context.Context, string) (redis.UniversalClient, error) {
	return r.client, nil
}

func (singleRouter) failed(error) {}

func (r singleRouter) live(context.Context) ([]redis.UniversalClient, error) {
	return []redis.UniversalClient{r.client}, nil
}

func (singleRouter) node(_ context.Context, addr string, _ bool) (redis.UniversalClient, error) {
	return nil, fmt.Errorf("redirected to %s outside a cluster", addr)
}

func (singleRouter) close() {}

// clusterRouter runs each slot's scripts on the client of the slot's master,
// not through the cluster client's own routing: that one re-sends a command
// after a lost reply, and the decide script is not idempotent. Redirections
// are followed by the batcher (Redis answers MOVED and ASK before running
// anything); a MOVED, or a failed call (a dead node), makes the router
// reload the slot map in the background, so the next calls go where the
// slots now are.
type clusterRouter struct {
	cluster *redis.ClusterClient
	mu      sync.Mutex
	nodes   map[string]*redis.Client // redirection targets seen, by address
	opened  []*redis.Client          // those of them this router opened
}

func newClusterRouter(cc *redis.ClusterClient) *clusterRouter {
	return &clusterRouter{cluster: cc, nodes: map[string]*redis.Client{}}
}

func (*clusterRouter) slot(key string) int { return keySlot(key) }

func (r *clusterRouter) server(ctx context.Context, key string) (redis.UniversalClient, error) {
	return r.cluster.MasterForKey(ctx, key)
}

func (r *clusterRouter) failed(error) { r.cluster.ReloadState(context.Background()) }

func (r *clusterRouter) live(ctx context.Context) ([]redis.UniversalClient, error) {
	var mu sync.Mutex
	var masters []redis.UniversalClient
	err := r.cluster.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		masters = append(masters, c)
		return nil
	})
	return masters, err
}

// node returns the client of the node at addr: one seen before, else the
// cluster client's own for that address, else one opened with the same
// options (a node that joined since the slot map was loaded). Looking up
// the cluster client's nodes reloads the slot map, so it happens once per
// address, within ctx. A MOVED also asks for a reload in the background.
func (r *clusterRouter) node(ctx context.Context, addr string, moved bool) (redis.UniversalClient, error) {
	if moved {
		r.cluster.ReloadState(context.Background())
	}
	r.mu.Lock()
	c, ok := r.nodes[addr]
	r.mu.Unlock()
	if ok {
		return c, nil
	}
	var found, known *redis.Client
	var mu sync.Mutex
	err := r.cluster.ForEachShard(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		if c.Options().Addr == addr {
			found = c
		}
		known = c
		return nil
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.nodes[addr]; ok {
		return c, nil // another call got there first
	}
	switch {
	case found != nil:
		r.nodes[addr] = found
		return found, nil
	case known == nil:
		return nil, fmt.Errorf("no cluster node known to reach %s: %w", addr, err)
	}
	opts := *known.Options()
	opts.Addr = addr
	c = redis.NewClient(&opts)
	r.nodes[addr], r.opened = c, append(r.opened, c)
	return c, nil
}

func (r *clusterRouter) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.opened {
		_ = c.Close() // the limiter is closing: nothing is left to do about it
	}
	r.opened, r.nodes = nil, map[string]*redis.Client{}
}
