package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/hedgerow/hedgerow/internal/config"
)

func newConfigCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Work with hedgerow configuration files",
	}
	cmd.AddCommand(newConfigCheckCmd())
	return cmd
}

func newConfigCheckCmd() *cobra.Command {
	var role string
	cmd := &cobra.Command{
		Use:   "check FILE",
		Short: "Validate a configuration file and print every problem",
		Long: `check loads FILE as a process of the given role would, including the
environment variables holding the secrets that role needs, and prints every
problem, one per line as file:line: path: message, or "ok". A warning (a
setting that loads but is almost surely not meant, such as an example's
placeholder key hash) is printed as file:line: path: warning: message and
does not fail the check.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := config.ParseRole(role)
			if err != nil {
				return err
			}
			cfg, err := config.Load(args[0], r, os.LookupEnv)
			var problems config.Problems
			switch {
			case errors.As(err, &problems):
				for _, p := range problems {
					if _, werr := fmt.Fprintln(cmd.OutOrStdout(), p); werr != nil {
						return werr
					}
				}
				return invalidConfigError{file: args[0], problems: problems}
			case err != nil:
				return err
			}
			if err := printWarnings(cmd.OutOrStdout(), cfg); err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), "ok")
			return err
		},
	}
	cmd.Flags().StringVar(&role, "role", string(config.RoleServe), "role to check for: serve, gateway or worker")
	return cmd
}

// printWarnings prints a loaded configuration's warnings, one per line.
func printWarnings(w io.Writer, cfg *config.Config) error {
	for _, p := range cfg.Warnings {
		if _, err := fmt.Fprintln(w, p); err != nil {
			return err
		}
	}
	return nil
}

// invalidConfigError reports that config check found problems; they have
// already been printed, so the error only summarises them. It wraps them,
// so errors.Is sees the errors they stand for (config.ErrOpenListener).
type invalidConfigError struct {
	file     string
	problems config.Problems
}

// Unwrap is the problems.
func (e invalidConfigError) Unwrap() error { return e.problems }

func (e invalidConfigError) Error() string {
	n, noun := e.problems.Refusals(), "problems"
	if n == 1 {
		noun = "problem"
	}
	return fmt.Sprintf("config check: %s has %d %s", e.file, n, noun)
}

// ExitCode makes the process exit with 1, as linters do when they find problems.
func (e invalidConfigError) ExitCode() int { return 1 }
