package sessions.hdfs;

import java.io.BufferedReader;
import java.io.File;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.hdfs.HdfsConfiguration;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.hdfs.protocol.DatanodeID;
import org.apache.hadoop.hdfs.server.datanode.DataNode;
import org.apache.hadoop.hdfs.server.datanode.DataNodeTestUtils;
import org.apache.hadoop.security.UserGroupInformation;

/**
 * A real HDFS on 127.0.0.1 in one JVM (Hadoop's MiniDFSCluster: a NameNode and N DataNodes speaking the real RPC,
 * data transfer and WebHDFS protocols) for tests and local runs; started by deploy/local-hdfs and
 * tests/hdfs_cluster.py.
 *
 * <pre>
 *   java -cp build/hdfs/*:PYSPARK_JARS/* sessions.hdfs.LocalHdfs --dir D [--port N] [--http-port N] [--datanodes N]
 * </pre>
 * Prints {@code READY hdfs://127.0.0.1:RPC http://127.0.0.1:HTTP} on stdout once the NameNode is out of safe mode
 * with every DataNode registered, then answers one line per command read from stdin ({@code OK ...} or
 * {@code ERROR ...}): {@code restart-namenode}, {@code stop-datanode I}, {@code restart-datanode I},
 * {@code shutdown}. EOF on stdin (the parent died) shuts down too.
 */
public final class LocalHdfs {
    private static final int WAIT_MS = 120_000;

    private final MiniDFSCluster cluster;
    private final String[] dataNodeNames; // stable names (xfer address): the cluster's own list reorders on restarts
    private final MiniDFSCluster.DataNodeProperties[] stopped;
    private final AtomicBoolean down = new AtomicBoolean();

    private LocalHdfs(MiniDFSCluster cluster) {
        this.cluster = cluster;
        int n = cluster.getDataNodes().size();
        dataNodeNames = new String[n];
        stopped = new MiniDFSCluster.DataNodeProperties[n];
        for (int i = 0; i < n; i++) {
            dataNodeNames[i] = name(cluster.getDataNodes().get(i));
        }
    }

    public static void main(String[] args) {
        // stdout is the control channel: keep it for ourselves and send everything else (Hadoop's logging) to stderr.
        PrintStream control = new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);
        System.setOut(System.err);
        LocalHdfs hdfs;
        try {
            hdfs = start(args);
        } catch (Exception | AssertionError e) { // a port in use, a bad option: one line for the launcher
            e.printStackTrace();
            control.println("ERROR " + oneLine(e));
            System.exit(1);
            return;
        }
        control.println("READY hdfs://127.0.0.1:" + hdfs.cluster.getNameNodePort()
            + " http://127.0.0.1:" + hdfs.cluster.getNameNode().getHttpAddress().getPort());

        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try {
            String line;
            while ((line = in.readLine()) != null && !line.trim().equals("shutdown")) {
                String[] words = line.trim().split("\\s+");
                if (!words[0].isEmpty()) {
                    control.println(hdfs.answer(words));
                }
            }
        } catch (IOException e) {
            e.printStackTrace(); // stdin unreadable: as EOF
        }
        hdfs.shutdown();
        control.println("OK shutdown");
        System.exit(0); // Hadoop leaves non-daemon threads behind
    }

    private static LocalHdfs start(String[] args) throws IOException {
        int port = 0;
        int httpPort = 0;
        int dataNodes = 1;
        String dir = null;
        for (int i = 0; i + 1 < args.length; i += 2) {
            switch (args[i]) {
                case "--port" -> port = Integer.parseInt(args[i + 1]);
                case "--http-port" -> httpPort = Integer.parseInt(args[i + 1]);
                case "--datanodes" -> dataNodes = Integer.parseInt(args[i + 1]);
                case "--dir" -> dir = args[i + 1];
                default -> throw new IllegalArgumentException("unknown option " + args[i]);
            }
        }
        if (dir == null || args.length % 2 != 0) {
            throw new IllegalArgumentException("usage: LocalHdfs --dir D [--port N] [--http-port N] [--datanodes N]");
        }

        Configuration conf = new HdfsConfiguration();
        conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, new File(dir).getAbsolutePath());
        // Permissions on, as on a real cluster, yet out of the way: this JVM's own user (the one that runs Spark and
        // the product here) and `sessions` (tests/hdfs_cluster.py's WebHDFS user) are superusers, and / is
        // world-writable. Any other user name is checked: a directory it may not write is a real AccessControlException.
        conf.setBoolean("dfs.permissions.enabled", true);
        conf.set("hadoop.user.group.static.mapping.overrides", "dr.who=;sessions=supergroup");
        UserGroupInformation.setConfiguration(conf); // the JVM's one group mapping, made from this conf
        conf.setBoolean("dfs.webhdfs.enabled", true);       // Python reaches it over HTTP, without a JVM
        // Heartbeats every second, a DataNode stale after 3 s and dead after ~12 s (2 x recheck + 10 x heartbeat)
        // instead of 10 min; DataNodes reconnect to a restarted NameNode every 100 ms instead of every second.
        conf.setLong("dfs.heartbeat.interval", 1);
        conf.setInt("dfs.namenode.heartbeat.recheck-interval", 1000);
        conf.setLong("dfs.namenode.stale.datanode.interval", 3000);
        conf.setInt("ipc.client.connect.retry.interval", 100);
        // The DataNodes' WebHDFS calls the NameNode through a pooled RPC connection: after a NameNode restart the
        // first call on one used in the last 10 s (ipc.client.connection.maxidletime) fails with EOFException
        // unless the client retries. Clients in this JVM do; Spark's need the same (tests/hdfs_cluster.py).
        conf.setBoolean("dfs.client.retry.policy.enabled", true);
        conf.set("dfs.client.retry.policy.spec", "100,50");

        MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf)
            .nameNodePort(port)
            .nameNodeHttpPort(httpPort)
            .numDataNodes(dataNodes)
            .format(true)                // a fresh namespace at every start
            .checkExitOnShutdown(false)  // shutdown must not throw because a daemon thread once called exit
            .build();
        LocalHdfs hdfs = new LocalHdfs(cluster);
        Runtime.getRuntime().addShutdownHook(new Thread(hdfs::shutdown, "local-hdfs-shutdown")); // SIGTERM
        cluster.waitActive();
        cluster.getFileSystem().setPermission(new Path("/"), new FsPermission((short) 0777));
        return hdfs;
    }

    /** One command's answer line: "OK <command>" once the cluster is in that state, or "ERROR <why>". */
    private String answer(String[] words) {
        try {
            return "OK " + run(words);
        } catch (Exception | AssertionError e) {
            e.printStackTrace();
            return "ERROR " + oneLine(e);
        }
    }

    private static String oneLine(Throwable e) {
        return String.valueOf(e).replace('\n', ' ');
    }

    private String run(String[] words) throws Exception {
        switch (words[0]) {
            case "restart-namenode" -> {
                // Same ports (the cluster keeps the bound addresses in its conf); waits until the NameNode is out of
                // safe mode and every running DataNode has re-registered.
                cluster.restartNameNode(true);
                return "restart-namenode";
            }
            case "stop-datanode" -> {
                int i = index(words);
                if (stopped[i] == null) {
                    DatanodeID id = dataNode(i).getDatanodeId();
                    stopped[i] = stop(i);
                    cluster.setDataNodeDead(id); // the NameNode stops placing blocks on it now, not after expiry
                }
                return "stop-datanode " + i;
            }
            case "restart-datanode" -> {
                int i = index(words);
                MiniDFSCluster.DataNodeProperties props = stopped[i] != null ? stopped[i] : stop(i);
                cluster.restartDataNode(props, true); // same storage and data transfer port: the same node
                stopped[i] = null;
                DataNode dn = dataNode(i);
                cluster.waitDatanodeFullyStarted(dn, WAIT_MS); // registered with the NameNode,
                cluster.waitActive();                          // reported live by it,
                DataNodeTestUtils.triggerBlockReport(dn);      // and its blocks located again (a full block report)
                return "restart-datanode " + i;
            }
            default -> throw new IllegalArgumentException("unknown command " + words[0]);
        }
    }

    private int index(String[] words) {
        int i = Integer.parseInt(words.length > 1 ? words[1] : "");
        if (i < 0 || i >= dataNodeNames.length) {
            throw new IllegalArgumentException("no DataNode " + i + " (0.." + (dataNodeNames.length - 1) + ")");
        }
        return i;
    }

    private DataNode dataNode(int i) {
        for (DataNode dn : cluster.getDataNodes()) {
            if (name(dn).equals(dataNodeNames[i])) {
                return dn;
            }
        }
        throw new IllegalStateException("DataNode " + i + " is not running");
    }

    private MiniDFSCluster.DataNodeProperties stop(int i) {
        return cluster.stopDataNode(cluster.getDataNodes().indexOf(dataNode(i)));
    }

    /** ip:port of its data transfer socket: bound as soon as it starts (its DatanodeID waits for registration). */
    private static String name(DataNode dn) {
        InetSocketAddress addr = dn.getXferAddress();
        return addr.getAddress().getHostAddress() + ":" + addr.getPort();
    }

    private void shutdown() {
        if (down.compareAndSet(false, true)) {
            cluster.shutdown();
        }
    }
}
