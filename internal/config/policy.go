package config

// Defaults returns the policy a file that sets nothing gets: every default of
// the table, as the simulator's hedgerow strategy runs them.
func Defaults() *Policy {
	c := &Config{Policies: map[string]*Policy{DefaultPolicy: {}}}
	if err := applyDefaults(c, func(string) bool { return false }); err != nil {
		panic(err) // the defaults table is checked by tests; this cannot fail at run time
	}
	return c.Policies[DefaultPolicy]
}
