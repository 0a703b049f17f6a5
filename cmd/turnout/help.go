package main

import "github.com/turnout/turnout/internal/cli"

// The commands' help texts (one example each; TestHelp checks them).
var (
	versionCmd = cli.Command{
		Synopsis: "turnout version",
		About:    "Prints the version turnout was built as (set with -ldflags \"-X main.version=...\" by make build).",
		Example:  "turnout version",
	}
	serveCmd = cli.Command{
		Synopsis: "turnout serve [--config FILE] [--listen ADDR] [--haproxy-dir DIR | --nginx-dir DIR] [flags]",
		About: `Serves route decisions (POST /internal/route), /healthz, /readyz, /metrics and
completion feedback. Reloads the config on SIGHUP and when the file changes.
With --haproxy-dir or --nginx-dir it also keeps the rendered proxy's pools in
sync. Without --config it uses the embedded default (four loopback replicas on
127.0.0.1:8001-8004, listening on 127.0.0.1:9090).`,
		Example: "turnout serve --config /etc/turnout/turnout.yaml --haproxy-dir /etc/haproxy/turnout",
	}
	checkCmd = cli.Command{
		Synopsis: "turnout check [--config FILE | -] [--proxy auto|haproxy|nginx|both|none] [--require-endpoints] [flags]",
		About: `Checks a config before a reload, and exits 0 when it is safe, 1 on any problem:
every config problem at once (fields, values, policies and their parameters,
model names a replica would answer 404 for), GET /v1/models of every static
endpoint (an unreachable one is a warning unless --require-endpoints), and the
proxy configs rendered into a temporary directory and checked by haproxy -c
and nginx -t (skipped with a note when the binary is not installed). Nothing
is written (a feedback token file that does not exist yet is left for serve)
and nothing running is touched. "-" reads the config from stdin: a turnout
config, or Kubernetes manifests whose ConfigMap holds turnout.yaml (helm
template ... | turnout check -). Warns on nginx header-mode combinations
that cannot work (several deployments without a model header, policies that
read the prompt, prefill/decode).`,
		Example: "turnout check --config /etc/turnout/turnout.yaml && systemctl reload turnout",
	}
	renderCmd = cli.Command{
		Synopsis: "turnout render haproxy|nginx [--config FILE] --out DIR [flags]",
		About: `Writes the proxy configuration and glue for a turnout config.
Targets: haproxy (haproxy.cfg + SPOE file, or Lua), nginx (nginx.conf + njs).
Run "turnout render haproxy --help" or "turnout render nginx --help" for a target's flags.`,
		Example: "turnout render haproxy --config turnout.yaml --out /etc/haproxy/turnout",
	}
	renderHAProxyCmd = cli.Command{
		Synopsis: "turnout render haproxy [--config FILE] --out DIR [--path-prefix DIR] [--socket PATH] [--check=false]",
		About: `Writes haproxy.cfg, turnout-spoe.conf, turnout.lua (and models.map) into DIR;
files refer to each other by DIR's absolute path, or by --path-prefix's when
they are used from another path than they are written to (a container
writing to /out for the host's /etc/haproxy/turnout). Start HAProxy with:
haproxy -f DIR/haproxy.cfg (turnout serve --haproxy-dir DIR serves its SPOE agent)`,
		Example: "turnout render haproxy --config turnout.yaml --out /etc/haproxy/turnout",
	}
	renderNginxCmd = cli.Command{
		Synopsis: "turnout render nginx [--config FILE] --out DIR [--path-prefix DIR] [--nginx-user USER] [--check=false]",
		About: `Writes nginx.conf and the njs module into DIR (paths inside under
--path-prefix when set, as for haproxy). Start nginx with:
nginx -p DIR -c DIR/nginx.conf`,
		Example: "turnout render nginx --config turnout.yaml --out /etc/nginx/turnout --nginx-user www-data",
	}
)
