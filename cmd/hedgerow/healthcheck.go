package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/hedgerow/hedgerow/internal/tools/healthcheck"
)

func newHealthcheckCmd() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "healthcheck [--timeout D] URL",
		Short: "Exit 0 when URL answers 2xx, else non-zero with the reason (for images without curl)",
		Long: `healthcheck sends one GET to URL and exits 0 when it answers 2xx within the
timeout; otherwise it prints one line saying why — the connection refused, no
answer in time, or the status — and exits 1. Redirects are not followed. It is
the probe of images that hold nothing but hedgerow (a scratch image has no
curl): e.g. HEALTHCHECK CMD ["hedgerow", "healthcheck", "http://127.0.0.1:8080/readyz"].`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return healthcheck.Check(cmd.Context(), args[0], timeout)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", healthcheck.DefaultTimeout, "how long to wait for the answer (connect, request and headers)")
	return cmd
}
