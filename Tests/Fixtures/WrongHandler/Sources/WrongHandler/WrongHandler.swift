import VigilKit

/// Cancel's handler: the download arrives as the declared `ObjectPath`.
public func cancelMethod() -> BusMethod {
    #if WRONG_HANDLER
    VigilAPI.DownloadSession.cancel.bind(mutating: true) { (_: BusCaller, download: String) in
        print("cancel", download)
        return BusTuple()
    }
    #else
    VigilAPI.DownloadSession.cancel.bind(mutating: true) { (_: BusCaller, download: ObjectPath) in
        print("cancel", download)
        return BusTuple()
    }
    #endif
}
