// Package docker_test checks docker/compose.yaml without a Docker engine: it
// parses, and its servers use the same ports, loopback binding, broker
// settings and versions as scripts/services.sh, which CI actually runs.
package docker_test

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

type service struct {
	Image       string            `yaml:"image"`
	Profiles    []string          `yaml:"profiles"`
	NetworkMode string            `yaml:"network_mode"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
}

type compose struct {
	Services map[string]service `yaml:"services"`
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// props parses a Java properties file (key=value, # comments).
func props(text string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok {
			m[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return m
}

// scriptDefault reads NAME=${RMQTX_X:-default} from scripts/services.sh.
func scriptDefault(t *testing.T, script, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + name + `=\$\{[A-Z_]+:-([^}]*)\}`).FindStringSubmatch(script)
	require.NotNil(t, m, "services.sh has no default for %s", name)
	return m[1]
}

func TestComposeMatchesScripts(t *testing.T) {
	var c compose
	require.NoError(t, yaml.Unmarshal([]byte(read(t, "compose.yaml")), &c))
	script := read(t, "../scripts/services.sh")
	conf := props(read(t, "../scripts/rocketmq/broker.conf"))
	pom := read(t, "../scripts/rocketmq/pom.xml")

	for _, name := range []string{"namesrv", "broker", "mysql"} {
		s, ok := c.Services[name]
		require.True(t, ok, "service %s missing", name)
		require.Equal(t, "host", s.NetworkMode, "%s must share the host's loopback", name)
	}

	// Same RocketMQ version as the jars the scripts run.
	version := regexp.MustCompile(`<rocketmq.version>([^<]+)<`).FindStringSubmatch(pom)[1]
	require.Equal(t, scriptDefault(t, script, "ROCKETMQ_VERSION"), version)
	require.Equal(t, "apache/rocketmq:"+version, c.Services["namesrv"].Image)
	require.Equal(t, "apache/rocketmq:"+version, c.Services["broker"].Image)

	// The broker mounts the very broker.conf the scripts start from.
	broker := c.Services["broker"]
	require.Contains(t, broker.Volumes, "../scripts/rocketmq/broker.conf:/home/rocketmq/broker.conf:ro")
	require.Equal(t, []string{"sh", "mqbroker", "-c", "/home/rocketmq/broker.conf"}, broker.Command)

	// And that file carries the scripts' defaults and the loopback settings.
	require.Equal(t, scriptDefault(t, script, "TX_TIMEOUT_MS"), conf["transactionTimeOut"])
	require.Equal(t, scriptDefault(t, script, "TX_CHECK_INTERVAL_MS"), conf["transactionCheckInterval"])
	require.Equal(t, scriptDefault(t, script, "TX_CHECK_MAX"), conf["transactionCheckMax"])
	// The op records of answered halves are written before the broker
	// checks them: otherwise it re-checks and re-stores committed events.
	var timeout, opBatch int
	_, err := fmt.Sscan(conf["transactionTimeOut"], &timeout)
	require.NoError(t, err)
	_, err = fmt.Sscan(conf["transactionOpBatchInterval"], &opBatch)
	require.NoError(t, err, "broker.conf sets transactionOpBatchInterval (the broker's default 3000 is not below the test bed's transactionTimeOut)")
	require.Less(t, opBatch, timeout, "transactionOpBatchInterval below transactionTimeOut")
	require.Equal(t, scriptDefault(t, script, "BROKER_PORT"), conf["listenPort"])
	require.Equal(t, "127.0.0.1:"+scriptDefault(t, script, "NAMESRV_PORT"), conf["namesrvAddr"])
	require.Equal(t, "127.0.0.1", conf["brokerIP1"])
	require.Equal(t, "127.0.0.1", conf["bindAddress"])
	require.Equal(t, "true", conf["autoCreateTopicEnable"])

	ns := strings.Join(c.Services["namesrv"].Command, " ")
	require.Contains(t, ns, "listenPort="+scriptDefault(t, script, "NAMESRV_PORT"))
	require.Contains(t, ns, "bindAddress=127.0.0.1")

	my := c.Services["mysql"]
	require.Contains(t, my.Command, "--bind-address=127.0.0.1")
	require.Contains(t, my.Command, "--port="+scriptDefault(t, script, "MYSQL_PORT"))
	require.Equal(t, scriptDefault(t, script, "MYSQL_USER"), my.Environment["MYSQL_USER"])
	require.Equal(t, scriptDefault(t, script, "MYSQL_PASSWORD"), my.Environment["MYSQL_PASSWORD"])
}

// The "cluster" profile's broker-b is the second master of
// `RMQTX_BROKERS=2 scripts/services.sh up`: the same image and reference
// broker.conf, renamed broker-b, on the script's broker-b port (broker-a's
// plus the script's offset) with HA one above, its own store, and the
// script's cluster heap. The default profile stays single-broker.
func TestComposeClusterProfile(t *testing.T) {
	var c compose
	require.NoError(t, yaml.Unmarshal([]byte(read(t, "compose.yaml")), &c))
	script := read(t, "../scripts/services.sh")
	conf := props(read(t, "../scripts/rocketmq/broker.conf"))

	for name, s := range c.Services {
		if name != "broker-b" && name != "postgres" && !strings.HasSuffix(name, "-ha") && !strings.HasPrefix(name, "broker-n") {
			require.Empty(t, s.Profiles, "%s runs in the default (single-broker) profile", name)
		}
	}
	b, ok := c.Services["broker-b"]
	require.True(t, ok, "service broker-b missing")
	require.Equal(t, []string{"cluster"}, b.Profiles)
	require.Equal(t, "host", b.NetworkMode)
	require.Equal(t, c.Services["broker"].Image, b.Image)
	require.Contains(t, b.Volumes, "../scripts/rocketmq/broker.conf:/home/rocketmq/broker.conf:ro")
	require.Len(t, b.Command, 3)
	cmd := b.Command[2]

	off := regexp.MustCompile(`\$\(\(BROKER_PORT \+ (\d+)\)\)`).FindStringSubmatch(scriptDefault(t, script, "BROKER_B_PORT"))
	require.NotNil(t, off, "services.sh derives broker-b's port from broker-a's")
	var portA, delta int
	_, err := fmt.Sscan(conf["listenPort"], &portA)
	require.NoError(t, err)
	_, err = fmt.Sscan(off[1], &delta)
	require.NoError(t, err)
	require.Equal(t, scriptDefault(t, script, "BROKER_PORT"), conf["listenPort"])
	require.Contains(t, cmd, fmt.Sprintf("s/^listenPort=.*/listenPort=%d/", portA+delta))
	require.Contains(t, cmd, fmt.Sprintf("s/^haListenPort=.*/haListenPort=%d/", portA+delta+1), "HA one above, as services.sh does")
	require.Contains(t, cmd, "s/^brokerName=.*/brokerName=broker-b/")
	require.Contains(t, cmd, "storePathRootDir=/home/rocketmq/store-b")
	require.Contains(t, cmd, "exec sh mqbroker -c /tmp/broker-b.conf")
	for _, key := range []string{"brokerName", "listenPort", "haListenPort", "storePathRootDir", "storePathCommitLog"} {
		require.Contains(t, conf, key, "the sed expressions rewrite a key broker.conf has")
	}

	heap := regexp.MustCompile(`\[\[ \$BROKERS == 2 \]\] && echo (\d+[mg])`).FindStringSubmatch(script)
	require.NotNil(t, heap, "services.sh sets a cluster heap")
	require.Contains(t, b.Environment["JAVA_OPT_EXT"], "-Xms"+heap[1]+" -Xmx"+heap[1])
}

// The "postgres" profile's server is the one `scripts/services.sh up`
// starts: the script's port on loopback only, its user, password and
// database, the byte-order locale and the same durability settings, and the
// PostgreSQL major version of the test bed's Debian packages (15).
func TestComposePostgresProfile(t *testing.T) {
	var c compose
	require.NoError(t, yaml.Unmarshal([]byte(read(t, "compose.yaml")), &c))
	script := read(t, "../scripts/services.sh")
	pg, ok := c.Services["postgres"]
	require.True(t, ok, "service postgres missing")
	require.Equal(t, []string{"postgres"}, pg.Profiles)
	require.Equal(t, "host", pg.NetworkMode)
	require.Equal(t, "postgres:15", pg.Image)
	cmd := strings.Join(pg.Command, " ")
	require.Contains(t, cmd, "listen_addresses=127.0.0.1")
	require.Contains(t, cmd, "-p "+scriptDefault(t, script, "PG_PORT"))
	for _, setting := range []string{"fsync=off", "full_page_writes=off", "synchronous_commit=on", "max_connections=400", "timezone=UTC"} {
		require.Contains(t, cmd, setting)
		require.Contains(t, script, "-c "+setting, "services.sh starts its server with %s too", setting)
	}
	require.Equal(t, scriptDefault(t, script, "PG_USER"), pg.Environment["POSTGRES_USER"])
	require.Equal(t, scriptDefault(t, script, "PG_PASSWORD"), pg.Environment["POSTGRES_PASSWORD"])
	require.Equal(t, scriptDefault(t, script, "PG_DATABASE"), pg.Environment["POSTGRES_DB"])
	require.Contains(t, pg.Environment["POSTGRES_INITDB_ARGS"], "--locale=C")
	require.Contains(t, script, "--locale=C", "services.sh initialises with the same locale")
}

// The "ha" profile is the HA bed of `RMQTX_BROKERS=ha scripts/services.sh
// up`: the name server with the controller embedded, from the same
// namesrv-ha.conf, on the script's HA ports, and two controller-mode
// replicas of one broker name, each built from broker.conf followed by
// broker-ha.conf as the script builds them, on the script's HA broker ports
// (HA one above, the second replica 100 above the first), with their own
// stores and the script's HA heap. The settings that decide what a failover
// loses are checked here too, so that editing them fails without a broker.
func TestComposeHAProfile(t *testing.T) {
	var c compose
	require.NoError(t, yaml.Unmarshal([]byte(read(t, "compose.yaml")), &c))
	script := read(t, "../scripts/services.sh")
	nsConf := props(read(t, "../scripts/rocketmq/namesrv-ha.conf"))
	haConf := props(read(t, "../scripts/rocketmq/broker-ha.conf"))
	conf := props(read(t, "../scripts/rocketmq/broker.conf"))

	haDefault := func(name string) int {
		m := regexp.MustCompile(`\[\[ -n \$\{RMQTX_` + name + `:-\} \]\] \|\| ` + name + `=(\d+)`).FindStringSubmatch(script)
		require.NotNil(t, m, "services.sh has no HA default for %s", name)
		var v int
		_, err := fmt.Sscan(m[1], &v)
		require.NoError(t, err)
		return v
	}
	nsPort, n0Port := haDefault("NAMESRV_PORT"), haDefault("BROKER_PORT")
	require.Contains(t, script, "[[ -n ${RMQTX_BROKER_B_PORT:-} ]] || BROKER_B_PORT=$((BROKER_PORT + 100))")
	require.Contains(t, script, "CONTROLLER_PORT=${RMQTX_CONTROLLER_PORT:-$((NAMESRV_PORT + 2))}")
	ctrl := fmt.Sprintf("127.0.0.1:%d", nsPort+2)
	for _, p := range []int{nsPort, nsPort + 2, n0Port - 2, n0Port, n0Port + 1, n0Port + 98, n0Port + 100, n0Port + 101} {
		require.NotContains(t, []string{"9876", conf["listenPort"], conf["haListenPort"]}, fmt.Sprint(p),
			"the HA bed's ports stay clear of the shared bed's")
	}

	// The name server: controller embedded, DLedger, one peer on the
	// controller port, never an unclean master.
	require.Equal(t, fmt.Sprint(nsPort), nsConf["listenPort"])
	require.Equal(t, "127.0.0.1", nsConf["bindAddress"])
	require.Equal(t, "true", nsConf["enableControllerInNamesrv"])
	require.Equal(t, "DLedger", nsConf["controllerType"])
	require.Equal(t, "n0-"+ctrl, nsConf["controllerDLegerPeers"])
	require.Equal(t, "n0", nsConf["controllerDLegerSelfId"])
	require.Equal(t, "false", nsConf["enableElectUncleanMaster"])
	require.Equal(t, "true", nsConf["notifyBrokerRoleChanged"])
	for _, key := range []string{"listenPort", "controllerDLegerPeers", "controllerStorePath"} {
		require.Contains(t, script, "s#^"+key+"=.*#", "services.sh rewrites %s of namesrv-ha.conf", key)
	}

	// The replicas: controller mode on that controller, every acknowledged
	// put on every in-sync replica, loopback addresses.
	require.Equal(t, "true", haConf["enableControllerMode"])
	require.Equal(t, ctrl, haConf["controllerAddr"])
	require.Equal(t, "-1", haConf["brokerId"])
	require.Equal(t, "SLAVE", haConf["brokerRole"])
	require.Equal(t, "true", haConf["allAckInSyncStateSet"])
	require.Equal(t, "127.0.0.1", haConf["brokerIP2"])
	require.Equal(t, "127.0.0.1", conf["brokerIP1"])
	require.Contains(t, script, "s#^controllerAddr=.*#controllerAddr=127.0.0.1:$CONTROLLER_PORT#")

	ns, ok := c.Services["namesrv-ha"]
	require.True(t, ok, "service namesrv-ha missing")
	require.Equal(t, []string{"ha"}, ns.Profiles)
	require.Equal(t, "host", ns.NetworkMode)
	require.Equal(t, c.Services["namesrv"].Image, ns.Image)
	require.Contains(t, ns.Volumes, "../scripts/rocketmq/namesrv-ha.conf:/home/rocketmq/namesrv-ha.conf:ro")
	require.Equal(t, []string{"sh", "mqnamesrv", "-c", "/home/rocketmq/namesrv-ha.conf"}, ns.Command)

	heap := regexp.MustCompile(`\[\[ \$BROKERS == ha && -z \$\{RMQTX_BROKER_HEAP:-\} \]\]; then BROKER_HEAP=(\d+[mg])`).FindStringSubmatch(script)
	require.NotNil(t, heap, "services.sh sets an HA heap")
	for i, name := range []string{"broker-n0", "broker-n1"} {
		b, ok := c.Services[name]
		require.True(t, ok, "service %s missing", name)
		require.Equal(t, []string{"ha"}, b.Profiles)
		require.Equal(t, "host", b.NetworkMode)
		require.Equal(t, c.Services["broker"].Image, b.Image)
		require.Contains(t, b.Volumes, "../scripts/rocketmq/broker.conf:/home/rocketmq/broker.conf:ro")
		require.Contains(t, b.Volumes, "../scripts/rocketmq/broker-ha.conf:/home/rocketmq/broker-ha.conf:ro")
		require.Len(t, b.Command, 3)
		cmd := b.Command[2]
		port := n0Port + 100*i
		node := fmt.Sprintf("n%d", i)
		require.Contains(t, cmd, "cat /home/rocketmq/broker.conf /home/rocketmq/broker-ha.conf |", "broker-ha.conf after broker.conf, as services.sh appends it")
		require.Contains(t, cmd, fmt.Sprintf("s/^listenPort=.*/listenPort=%d/", port))
		require.Contains(t, cmd, fmt.Sprintf("s/^haListenPort=.*/haListenPort=%d/", port+1))
		require.Contains(t, cmd, fmt.Sprintf("s/^namesrvAddr=.*/namesrvAddr=127.0.0.1:%d/", nsPort))
		require.Contains(t, cmd, "storePathRootDir=/home/rocketmq/store-"+node)
		require.Contains(t, cmd, "exec sh mqbroker -c /tmp/"+node+".conf")
		require.NotContains(t, cmd, "brokerName=", "both replicas keep broker.conf's brokerName")
		require.Contains(t, b.Environment["JAVA_OPT_EXT"], "-Xms"+heap[1]+" -Xmx"+heap[1])
	}
}
