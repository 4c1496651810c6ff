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
	node(addr string, moved bool) (redis.UniversalClient, error)
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

func (singleRouter) node(addr string, _ bool) (redis.UniversalClient, error) {
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
	others  map[string]*redis.Client // nodes the slot map did not list
}

func newClusterRouter(cc *redis.ClusterClient) *clusterRouter {
	return &clusterRouter{cluster: cc, others: map[string]*redis.Client{}}
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

// node finds the client of the node at addr among the cluster client's, or
// opens one with the same options (a node that joined since the slot map
// was loaded).
func (r *clusterRouter) node(addr string, moved bool) (redis.UniversalClient, error) {
	ctx := context.Background()
	if moved {
		r.cluster.ReloadState(ctx)
	}
	var found, any *redis.Client
	var mu sync.Mutex
	_ = r.cluster.ForEachShard(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		if c.Options().Addr == addr {
			found = c
		}
		any = c
		return nil
	})
	if found != nil {
		return found, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.others[addr]; ok {
		return c, nil
	}
	if any == nil {
		return nil, fmt.Errorf("no cluster node known to reach %s", addr)
	}
	opts := *any.Options()
	opts.Addr = addr
	c := redis.NewClient(&opts)
	r.others[addr] = c
	return c, nil
}

func (r *clusterRouter) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for addr, c := range r.others {
		c.Close()
		delete(r.others, addr)
	}
}
