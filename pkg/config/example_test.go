package config_test

import (
	"fmt"

	"github.com/slidingwindow/ratelimit/pkg/config"
)

// Parse a config and find the rule a descriptor gets, as the service would.
func Example() {
	cfg, err := config.Parse("api.yaml", []byte(`
domain: api
descriptors:
  - key: user_id
    rate_limit:
      unit: minute
      requests_per_unit: 100
      algorithm: gcra
      burst: 20
`), nil)
	if err != nil {
		panic(err)
	}
	rule, ok := cfg.Match("api", config.Entry{Key: "user_id", Value: "42"})
	fmt.Println(ok, rule.Source(), rule.Limits())
	// Output: true api.yaml:4 [{100 1m0s gcra 20 }]
}

// A config error names the file and line.
func ExampleParse_error() {
	_, err := config.Parse("api.yaml", []byte(`
domain: api
descriptors:
  - key: user_id
    rate_limit:
      unit: fortnight
      requests_per_unit: 100
`), nil)
	fmt.Println(err)
	// Output: api.yaml:6: unknown unit "fortnight", want one of second, minute, hour, day, week, month, year
}
