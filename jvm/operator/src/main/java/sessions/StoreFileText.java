package sessions;

import java.io.BufferedOutputStream;
import java.io.BufferedReader;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;

import org.apache.spark.SparkConf;
import org.apache.spark.io.CompressionCodec;
import org.apache.spark.io.CompressionCodec$;
import org.rocksdb.Options;
import org.rocksdb.ReadOptions;
import org.rocksdb.RocksDB;
import org.rocksdb.RocksDBException;
import org.rocksdb.SstFileReader;
import org.rocksdb.SstFileReaderIterator;

/** A state store file's contents as plain bytes, for an audit that searches them for a user id (state_store/audit.py,
 * `forget --verify`): the files are compressed, so their raw bytes hide most ids. Decoded by the libraries that wrote
 * them: Spark's own compression codec (HDFS-backed `.delta`/`.snapshot`, RocksDB `.changelog`; the codec named by the
 * stream's magic bytes) and RocksDB's SST reader (every key and value, each followed by a zero byte). Called in a
 * Spark driver through py4j, or as a JVM of its own with no Spark session (`main`). */
public final class StoreFileText {
    private static final byte[] LZ4 = "LZ4Block".getBytes(StandardCharsets.US_ASCII);
    private static final byte[] ZSTD = {0x28, (byte) 0xB5, 0x2F, (byte) 0xFD};
    private static final byte[] SNAPPY = {(byte) 0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0};
    private static final byte[] LZF = {'Z', 'V'};

    private StoreFileText() {
    }

    /** Decodes the local files named on standard input, one request a line -- `sst` or `stream`, the file, the file to
     * write, tab-separated -- answering each on standard output with `ok <length>` or `error <why, one line>`; ends
     * with its input. For an audit that needs no Spark session: such a JVM starts in a fraction of a session's time. */
    public static void main(String[] args) throws IOException {
        PrintStream answers = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        System.setOut(System.err);  // whatever a library prints is not an answer
        serve(new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)), answers);
    }

    /** Answers each request of `requests` (as `main` says) on `answers`, until the requests end. */
    static void serve(BufferedReader requests, PrintStream answers) throws IOException {
        SparkConf conf = new SparkConf(false);
        for (String line = requests.readLine(); line != null; line = requests.readLine()) {
            String[] request = line.split("\t", -1);
            try {
                if (request.length != 3) {
                    throw new IllegalArgumentException("expected: kind, file, output (tab-separated)");
                }
                byte[] data = Files.readAllBytes(Path.of(request[1]));
                long length = switch (request[0]) {
                    case "sst" -> sstTo(data, request[2]);
                    case "stream" -> streamTo(data, conf, request[2]);
                    default -> throw new IllegalArgumentException("unknown kind: " + request[0]);
                };
                answers.println("ok " + length);
            } catch (Exception | LinkageError error) {
                answers.println("error " + String.valueOf(error).replaceAll("\\s+", " "));
            }
        }
    }

    /** The codec Spark's state store wrote `data` with, from its first bytes. */
    static String codec(byte[] data) {
        for (Object[] known : new Object[][] {{LZ4, "lz4"}, {ZSTD, "zstd"}, {SNAPPY, "snappy"}, {LZF, "lzf"}}) {
            byte[] magic = (byte[]) known[0];
            if (data.length >= magic.length && Arrays.equals(Arrays.copyOf(data, magic.length), magic)) {
                return (String) known[1];
            }
        }
        throw new IllegalArgumentException("not a stream of any codec Spark's state store writes");
    }

    /** A compressed state file (delta, snapshot, changelog) decompressed with Spark's codec into the local file
     * `out`; its length. A file, not a return value: py4j hands a byte array back to Python a byte at a time. */
    public static long streamTo(byte[] data, SparkConf conf, String out) throws IOException {
        CompressionCodec codec = CompressionCodec$.MODULE$.createCodec(conf, codec(data));
        try (InputStream in = codec.compressedInputStream(new ByteArrayInputStream(data));
             OutputStream sink = new BufferedOutputStream(Files.newOutputStream(Path.of(out)))) {
            return in.transferTo(sink);
        }
    }

    /** Every key and value of an SST file (its bytes, read from any filesystem by the caller), each followed by a zero
     * byte, into the local file `out`; its length. */
    public static long sstTo(byte[] data, String out) throws RocksDBException, IOException {
        RocksDB.loadLibrary();
        Path local = Files.createTempFile("audit-", ".sst");
        long written = 0;
        try (OutputStream sink = new BufferedOutputStream(Files.newOutputStream(Path.of(out)));
             Options options = new Options();
             SstFileReader reader = new SstFileReader(options);
             ReadOptions read = new ReadOptions()) {
            Files.write(local, data);
            reader.open(local.toString());
            try (SstFileReaderIterator it = reader.newIterator(read)) {
                for (it.seekToFirst(); it.isValid(); it.next()) {
                    byte[] key = it.key();
                    byte[] value = it.value();
                    sink.write(key);
                    sink.write(0);
                    sink.write(value);
                    sink.write(0);
                    written += key.length + value.length + 2;
                }
                it.status();  // a read error ends the loop as an invalid iterator: raise it
            }
        } finally {
            Files.deleteIfExists(local);
        }
        return written;
    }
}
