package sessions;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
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
 * stream's magic bytes) and RocksDB's SST reader (every key and value, each followed by a zero byte). */
public final class StoreFileText {
    private static final byte[] LZ4 = "LZ4Block".getBytes(StandardCharsets.US_ASCII);
    private static final byte[] ZSTD = {0x28, (byte) 0xB5, 0x2F, (byte) 0xFD};
    private static final byte[] SNAPPY = {(byte) 0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0};
    private static final byte[] LZF = {'Z', 'V'};

    private StoreFileText() {
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

    /** A compressed state file (delta, snapshot, changelog) decompressed with Spark's codec. */
    public static byte[] stream(byte[] data, SparkConf conf) throws IOException {
        CompressionCodec codec = CompressionCodec$.MODULE$.createCodec(conf, codec(data));
        try (InputStream in = codec.compressedInputStream(new ByteArrayInputStream(data))) {
            return in.readAllBytes();
        }
    }

    /** Every key and value of an SST file (a local copy), each followed by a zero byte. */
    public static byte[] sst(String localPath) throws RocksDBException, IOException {
        RocksDB.loadLibrary();
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        try (Options options = new Options();
             SstFileReader reader = new SstFileReader(options);
             ReadOptions read = new ReadOptions()) {
            reader.open(localPath);
            try (SstFileReaderIterator it = reader.newIterator(read)) {
                for (it.seekToFirst(); it.isValid(); it.next()) {
                    out.write(it.key());
                    out.write(0);
                    out.write(it.value());
                    out.write(0);
                }
                it.status();  // a read error ends the loop as an invalid iterator: raise it
            }
        }
        return out.toByteArray();
    }

    /** The same for an SST file's bytes (read from HDFS or S3 by the caller). */
    public static byte[] sst(byte[] data) throws RocksDBException, IOException {
        Path local = Files.createTempFile("audit-", ".sst");
        try {
            Files.write(local, data);
            return sst(local.toString());
        } finally {
            Files.deleteIfExists(local);
        }
    }
}
