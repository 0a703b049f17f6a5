package main

import "github.com/turnout/turnout/internal/cli"

// The commands' help texts (one example each; TestHelp checks them).
var (
	serveCmd = cli.Command{
		Synopsis: "turnout serve [--config FILE] [--listen ADDR] [--haproxy-dir DIR | --nginx-dir DIR] [flags]",
		About: `Serves route decisions (POST /internal/route), /healthz, /readyz, /metrics and
completion feedback. Reloads the config on SIGHUP and when the file changes.
With --haproxy-dir or --nginx-dir it also keeps the rendered proxy's pools in
sync. Without --config it uses the embedded default (four loopback replicas on
127.0.0.1:8001-8004, listening on 127.0.0.1:9090).`,
		Example: "turnout serve --config /etc/turnout/turnout.yaml --haproxy-dir /etc/haproxy/turnout",
	}
	renderCmd = cli.Command{
		Synopsis: "turnout render haproxy|nginx [--config FILE] --out DIR [flags]",
		About: `Writes the proxy configuration and glue for a turnout config.
Targets: haproxy (haproxy.cfg + SPOE file, or Lua), nginx (nginx.conf + njs).
Run "turnout render haproxy --help" or "turnout render nginx --help" for a target's flags.`,
		Example: "turnout render haproxy --config turnout.yaml --out /etc/haproxy/turnout",
	}
	renderHAProxyCmd = cli.Command{
		Synopsis: "turnout render haproxy [--config FILE] --out DIR [--socket PATH] [--check=false]",
		About: `Writes haproxy.cfg, turnout-spoe.conf, turnout.lua (and models.map) into DIR;
files refer to each other by DIR's absolute path. Start HAProxy with:
haproxy -f DIR/haproxy.cfg (turnout serve --haproxy-dir DIR serves its SPOE agent)`,
		Example: "turnout render haproxy --config turnout.yaml --out /etc/haproxy/turnout",
	}
	renderNginxCmd = cli.Command{
		Synopsis: "turnout render nginx [--config FILE] --out DIR [--nginx-user USER] [--check=false]",
		About: `Writes nginx.conf and the njs module into DIR. Start nginx with:
nginx -p DIR -c DIR/nginx.conf`,
		Example: "turnout render nginx --config turnout.yaml --out /etc/nginx/turnout --nginx-user www-data",
	}
)
