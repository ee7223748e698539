/// The Vigil release this build belongs to.
public enum VigilVersion {
    public static let string = "0.1.0"
}
